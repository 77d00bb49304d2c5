package http_test

import (
	"encoding/base64"
	"fmt"
	"io"
	stdhttp "net/http"
	"net/http/httptest"
	"testing"
	"time"

	"dbcloud"

	"dbcloud/http"
)

// benchEnv is an API over the SQLite store with n services in project a,
// copies of one READY service with metrics (as BenchmarkAPI seeds them:
// creating them through the domain would hit the instance quota and take
// minutes). It returns the ID of that template service.
func benchEnv(b *testing.B, n int) (*env, string) {
	b.Helper()
	e := newEnv(b, "sqlite", noLimits)
	tmpl := seedTemplate(b, e)
	seedServices(b, e, tmpl, n)
	return e, tmpl.ID
}

func (e *env) authHeader() string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(e.a.AccessKey+":"+e.a.SecretKey))
}

// benchHandler times the handler alone: routing, auth, store, encoding.
func benchHandler(b *testing.B, e *env, path string) { benchHandlerEach(b, e, path, nil) }

// benchHandlerEach is benchHandler that runs before, untimed, ahead of
// every request.
func benchHandlerEach(b *testing.B, e *env, path string, before func()) {
	h := e.srv.Config.Handler
	auth := e.authHeader()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if before != nil {
			b.StopTimer()
			before()
			b.StartTimer()
		}
		req := httptest.NewRequest("GET", http.BasePath+path, nil)
		req.Header.Set("Authorization", auth)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
		}
	}
}

// benchHTTPS drives the server over HTTPS on loopback from parallel
// keep-alive clients and reports requests per second.
func benchHTTPS(b *testing.B, e *env, path string) {
	auth := e.authHeader()
	url := e.srv.URL + http.BasePath + path
	client := e.srv.Client()
	client.Transport.(*stdhttp.Transport).MaxIdleConnsPerHost = 64
	b.SetParallelism(4)
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := stdhttp.NewRequest("GET", url, nil)
			req.Header.Set("Authorization", auth)
			res, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				b.Errorf("GET %s: %d", path, res.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
}

func BenchmarkGetService(b *testing.B) {
	e, id := benchEnv(b, 1000)
	path := e.pa() + "/services/" + id
	b.Run("handler", func(b *testing.B) { benchHandler(b, e, path) })
	b.Run("https", func(b *testing.B) { benchHTTPS(b, e, path) })
}

func BenchmarkListServices(b *testing.B) {
	e, id := benchEnv(b, 1000)
	path := e.pa() + "/services"
	b.Run("handler", func(b *testing.B) { benchHandler(b, e, path) })
	// changed: one service of the project changes before every list (not
	// timed), so no list can be answered from what was kept: the cost of
	// a list after a write.
	b.Run("handler-changed", func(b *testing.B) {
		n := 0
		benchHandlerEach(b, e, path, func() {
			n++
			err := e.store.Update(b.Context(), func(tx dbcloud.Tx) error {
				s, err := tx.FindService(e.a.ProjectID, id)
				if err != nil {
					return err
				}
				s.Name = fmt.Sprintf("template-%d", n)
				return tx.UpdateService(s)
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("https", func(b *testing.B) { benchHTTPS(b, e, path) })
}
