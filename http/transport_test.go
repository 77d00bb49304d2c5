package http_test

import (
	"bufio"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud/http"
	"dbcloud/sqlite"
)

// TestAuthFailuresDoNotRefuseValidKeys: ten failed logins from an address
// use up its budget (the next failure is 429), yet a valid key from the
// same address still answers 200.
func TestAuthFailuresDoNotRefuseValidKeys(t *testing.T) {
	e := newEnv(t, "sqlite", http.DefaultConfig())
	bad := &cloud.NewAPIKey{AccessKey: e.a.AccessKey, SecretKey: "wrong"}
	for range 10 {
		e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", Key: bad})
	}
	res := e.want(429, "RATE_LIMITED", req{Method: "GET", Path: "/projects", Key: bad})
	if res.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	e.want(200, "", req{Method: "GET", Path: "/projects"})
	e.want(200, "", req{Method: "GET", Path: "/projects", Key: e.b})
}

// startServer serves e's cloud with the production server construction.
func startServer(t *testing.T, e *env, cfg http.ServerConfig) *httptest.Server {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	h := http.NewHandler(e.cloud, noLimits, logger)
	srv := httptest.NewUnstartedServer(h)
	srv.Config = http.NewServer(h, cfg, logger)
	srv.Listener = http.LimitConnsPerAddr(srv.Listener, cfg.MaxConnsPerAddr)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func dialTLS(t *testing.T, srv *httptest.Server) (*tls.Conn, error) {
	t.Helper()
	return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", srv.Listener.Addr().String(),
		&tls.Config{InsecureSkipVerify: true}) // the test server's own certificate
}

// TestSlowBodyIsCut: an authenticated client that sends its body a byte at
// a time is cut off after the read timeout, long before its body is done.
func TestSlowBodyIsCut(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	srv := startServer(t, e, http.ServerConfig{ReadTimeout: 500 * time.Millisecond, WriteTimeout: 2 * time.Second, IdleTimeout: 2 * time.Second})
	c, err := dialTLS(t, srv)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const bodyLen = 200
	auth := base64.StdEncoding.EncodeToString([]byte(e.a.AccessKey + ":" + e.a.SecretKey))
	fmt.Fprintf(c, "POST %s/projects/%s/vpcs HTTP/1.1\r\nHost: x\r\nAuthorization: Basic %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		http.BasePath, e.a.ProjectID, auth, bodyLen)
	ended := make(chan string, 1)
	go func() {
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			line = "connection ended: " + err.Error()
		}
		ended <- line
	}()
	// 200 bytes at one per 50 ms would take 10 s.
	for i := 0; i < bodyLen; i++ {
		select {
		case got := <-ended:
			t.Logf("after %d of %d body bytes: %s", i, bodyLen, strings.TrimSpace(got))
			return
		case <-time.After(50 * time.Millisecond):
		}
		if _, err := c.Write([]byte(" ")); err != nil {
			t.Logf("after %d of %d body bytes the server closed the connection: %v", i, bodyLen, err)
			return
		}
	}
	t.Fatal("the server read a slow body to its end; the read timeout did not cut it")
}

// TestConnectionsPerAddressCapped: one address holds at most the cap of
// connections; a further one is closed at once, and a slot freed is
// usable again.
func TestConnectionsPerAddressCapped(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	srv := startServer(t, e, http.ServerConfig{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxConnsPerAddr: 2})
	var held []*tls.Conn
	for range 2 {
		c, err := dialTLS(t, srv)
		if err != nil {
			t.Fatalf("connection within the cap: %v", err)
		}
		held = append(held, c)
	}
	if c, err := dialTLS(t, srv); err == nil {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, rerr := c.Read(make([]byte, 1))
		c.Close()
		if rerr == nil || !(rerr == io.EOF || strings.Contains(rerr.Error(), "reset") || strings.Contains(rerr.Error(), "closed")) {
			t.Errorf("a third connection from the same address was served: %v", rerr)
		}
	}
	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dialTLS(t, srv)
		if err == nil {
			fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			line, rerr := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if rerr == nil && strings.Contains(line, "200") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("a freed slot was not usable again: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	held[1].Close()
}

// TestStoreFullIs503: when the store's disk is full a change answers 503
// UNAVAILABLE with Retry-After and makes nothing, reads answer, and the
// same change succeeds once there is room. max_page_count makes SQLite
// answer as it does on ENOSPC (SQLITE_FULL) without filling a real disk.
func TestStoreFullIs503(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	db := e.store.(*sqlite.Store).DB()
	var pages int
	if err := db.QueryRowContext(t.Context(), "PRAGMA page_count").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), fmt.Sprintf("PRAGMA max_page_count = %d", pages+4)); err != nil {
		t.Fatal(err)
	}
	services := "/projects/" + e.a.ProjectID + "/services"
	create := func(i int) req {
		return req{Method: "POST", Path: services, Body: map[string]any{"name": fmt.Sprintf("svc-%d", i)}}
	}
	// Creates fill what room is left; the first that does not fit is
	// refused whole.
	accepted := 0
	for ; ; accepted++ {
		if accepted > 200 {
			t.Fatal("the store never filled")
		}
		res := e.do(create(accepted))
		if res.Status == 202 {
			continue
		}
		if res.Status != 503 || res.code(t) != "UNAVAILABLE" {
			t.Fatalf("create on a full store: %d %s, want 503 UNAVAILABLE", res.Status, res.Body)
		}
		if got := res.Header.Get("Retry-After"); got != "30" {
			t.Errorf("Retry-After = %q, want 30", got)
		}
		break
	}
	var list []map[string]any
	e.want(200, "", req{Method: "GET", Path: services}).decode(t, &list)
	if len(list) != accepted {
		t.Fatalf("%d services listed after %d accepted creates and a refused one", len(list), accepted)
	}
	if _, err := db.ExecContext(t.Context(), "PRAGMA max_page_count = 1073741823"); err != nil {
		t.Fatal(err)
	}
	e.want(202, "", create(accepted))
}
