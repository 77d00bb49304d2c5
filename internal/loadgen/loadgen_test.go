package loadgen_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud/internal/loadgen"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := loadgen.Percentile(d, tc.p); got != tc.want {
			t.Errorf("Percentile(1..100 ms, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := loadgen.Percentile(nil, 0.5); got != 0 {
		t.Errorf("Percentile(nil) = %v, want 0", got)
	}
}

func TestRun(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served.Add(1)%10 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	client := loadgen.NewClient(srv.Client().Transport.(*http.Transport).TLSClientConfig, 4)
	rec := loadgen.NewRecorder()
	loadgen.Run(context.Background(), 4, 200*time.Millisecond, func(ctx context.Context, i int) {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		loadgen.Do(ctx, rec, client, "get", req)
	})
	stats := rec.Stats()
	if len(stats) != 1 || stats[0].Kind != "get" {
		t.Fatalf("stats: %+v", stats)
	}
	s := stats[0]
	if s.Count == 0 || int64(s.Count) > served.Load() || s.Errors != 0 {
		t.Errorf("count %d, errors %d, served %d", s.Count, s.Errors, served.Load())
	}
	if s.Status[200]+s.Status[503] != s.Count || s.Count5xx() != s.Status[503] || s.Status[503] == 0 {
		t.Errorf("statuses %v of %d", s.Status, s.Count)
	}
	if s.P50 <= 0 || s.P50 > s.P99 || s.P99 > s.Max {
		t.Errorf("p50 %v p99 %v max %v", s.P50, s.P99, s.Max)
	}
}

func TestRecorder_Errors(t *testing.T) {
	rec := loadgen.NewRecorder()
	rec.Add("x", 0, time.Second, errors.New("connection refused"))
	rec.Add("x", 201, time.Millisecond, nil)
	s := rec.Stats()[0]
	if s.Errors != 1 || s.LastError != "connection refused" || s.Count != 1 || s.Status[201] != 1 {
		t.Errorf("stats %+v", s)
	}
}

// A client holds no more connections than it was made for, however many
// goroutines share it: a server that caps connections per address (dbcloud
// serve does, at 256) would close the extra ones, and their requests would
// fail with EOF.
func TestNewClientCapsConnections(t *testing.T) {
	var open, most atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Millisecond) // so that requests overlap
		w.Write([]byte(`{"ok":true}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		switch state {
		case http.StateNew:
			n := open.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	const conns = 4
	client := loadgen.NewClient(srv.Client().Transport.(*http.Transport).TLSClientConfig, conns)
	rec := loadgen.NewRecorder()
	loadgen.Run(context.Background(), 4*conns, 300*time.Millisecond, func(context.Context, int) {
		// Not the run's context: a request cut short when the run ends
		// closes its connection and frees its slot before the server sees
		// the close, and the dial for a waiting request would show the
		// server one connection more than the client holds.
		req, _ := http.NewRequest("GET", srv.URL, nil)
		loadgen.Do(context.Background(), rec, client, "get", req)
	})
	if s := rec.Stats(); len(s) != 1 || s[0].Count == 0 || s[0].Errors != 0 {
		t.Fatalf("stats: %+v", s)
	}
	if n := most.Load(); n > conns {
		t.Errorf("the server saw %d connections open at once, want at most %d", n, conns)
	}
}
