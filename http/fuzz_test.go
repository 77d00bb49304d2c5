package http_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	stdhttp "net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"dbcloud/http"
)

// FuzzRequestDecoding sends arbitrary bodies, paths and query strings to the
// API: whatever arrives, the answer is never a 5xx and every error carries
// the error body.
func FuzzRequestDecoding(f *testing.F) {
	e := newEnv(f, "sqlite", noLimits)
	h := http.NewHandler(e.cloud, noLimits, slog.New(slog.NewTextHandler(io.Discard, nil)))
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(e.a.AccessKey+":"+e.a.SecretKey))
	pid := e.a.ProjectID
	svc := e.readyService(map[string]any{"name": "fuzz", "environment_tag": "PROD"})
	for _, seed := range []struct{ method, path, body string }{
		{"POST", "/services", `{"name":"a","cpu_millis":"1000"}`},
		{"POST", "/services", `{"name":"a","addons":["ai"],"replica_count":1,"environment_tag":"PROD"}`},
		{"POST", "/services", `{"name":null,"addons":"ai"}`},
		{"POST", "/vpcs", `{"name":"v","cidr":"10.0.0.0/16","region_code":"local"}`},
		{"POST", "/services/{sid}/forkService", `{"fork_strategy":"PITR","target_time":"2026-01-01T00:00:00Z"}`},
		{"POST", "/services/{sid}/setHA", `{"replica_count":1e400}`},
		{"POST", "/services/{sid}/resize", `{"cpu_millis":"500","memory_gbs":"2"}`},
		{"POST", "/services/{sid}/replicaSets", `{"name":"r","cpu_millis":500.5,"memory_gbs":2,"nodes":1}`},
		{"POST", "/services/{sid}/replicaSets/x/resize", `[]`},
		{"GET", "/services/{sid}/logs?node=0&since=2026-01-01T00:00:00Z&search=%00", ``},
		{"POST", "/services/{sid}/updatePassword", `{"password":"\u0000\u0000\u0000\u0000\u0000\u0000\u0000\u0000"}`},
		{"DELETE", "/vpcs/0", ``},
	} {
		f.Add(seed.method, seed.path, seed.body)
	}
	f.Fuzz(func(t *testing.T, method, path, body string) {
		switch method {
		case "GET", "POST", "DELETE":
		default:
			method = "POST"
		}
		path = strings.ReplaceAll(path, "{sid}", svc.ServiceID)
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		req, err := stdhttp.NewRequest(method, "https://x"+http.BasePath+"/projects/"+pid+path, bytes.NewReader([]byte(body)))
		if err != nil {
			return // not a URL a client could send
		}
		req.Header.Set("Authorization", auth)
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", method, path, body, w.Code, w.Body)
		}
		if w.Code >= 400 {
			var eb struct{ Code, Message string }
			if json.Unmarshal(w.Body.Bytes(), &eb) != nil || eb.Code == "" || eb.Message == "" {
				t.Fatalf("%s %s: %d without an error body: %q", method, path, w.Code, w.Body)
			}
		}
	})
}
