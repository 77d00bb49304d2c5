package loadgen_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud/internal/loadgen"
)

// TestRunOpen_OfferedRate: every request due is sent, however slowly the
// server answers: the schedule does not wait for answers.
func TestRunOpen_OfferedRate(t *testing.T) {
	var inFlight, most atomic.Int64
	release := make(chan struct{})
	var sent atomic.Int64
	res := loadgen.RunOpen(context.Background(), 200, 250*time.Millisecond, 0, func(ctx context.Context, i int) {
		if _, ok := loadgen.Scheduled(ctx); !ok {
			t.Errorf("request %d: no due time in its context", i)
		}
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if sent.Add(1) == 50 {
			close(release) // the last one due frees them all
		}
		<-release
		inFlight.Add(-1)
	})
	if res.Issued != 50 || sent.Load() != 50 {
		t.Fatalf("issued %d, sent %d; want 50 (200/s for 250 ms)", res.Issued, sent.Load())
	}
	// No answer came before the last request was sent, so all were out at
	// once: a closed loop would have sent one per client.
	if most.Load() != 50 {
		t.Errorf("at most %d requests in flight, want all 50", most.Load())
	}
}

// TestRunOpen_NoCoordinatedOmission: a server that stalls for 500 ms at
// the start of a run is charged for every request due during the stall,
// each with the time it waited from its due time, not from when a busy
// client got round to sending it.
func TestRunOpen_NoCoordinatedOmission(t *testing.T) {
	var mu sync.Mutex // the server answers one request at a time
	var first atomic.Bool
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if first.CompareAndSwap(false, true) {
			time.Sleep(500 * time.Millisecond)
		}
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	client := loadgen.NewClient(srv.Client().Transport.(*http.Transport).TLSClientConfig, 64)
	rec := loadgen.NewRecorder()
	res := loadgen.RunOpen(context.Background(), 100, time.Second, 64, func(ctx context.Context, i int) {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		loadgen.Do(ctx, rec, client, "get", req)
	})
	s := rec.Stats()[0]
	if res.Issued != 100 || s.Count != 100 || s.Errors != 0 {
		t.Fatalf("issued %d, answered %d, errors %d (%s)", res.Issued, s.Count, s.Errors, s.LastError)
	}
	// Requests due in the first 300 ms waited at least 200 ms for the
	// stall to end: about 30 of them, however fast the machine.
	slow := 0
	for _, d := range rec.Latencies("get") {
		if d >= 200*time.Millisecond {
			slow++
		}
	}
	if slow < 25 {
		t.Errorf("%d requests took 200 ms or more from their due time, want the ~30 due during the stall", slow)
	}
	if s.P50 > s.P99 || s.P99 < 200*time.Millisecond {
		t.Errorf("p50 %v p99 %v: the stall is missing from p99", s.P50, s.P99)
	}
}

// TestDo_ClosedLoopMeasuresFromSend: without a due time, Do measures from
// when it sends, as before.
func TestDo_ClosedLoopMeasuresFromSend(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	client := loadgen.NewClient(srv.Client().Transport.(*http.Transport).TLSClientConfig, 1)
	rec := loadgen.NewRecorder()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	loadgen.Do(loadgen.WithScheduled(context.Background(), time.Now().Add(-time.Hour)), rec, client, "late", req)
	loadgen.Do(context.Background(), rec, client, "now", req)
	if late, now := rec.Latencies("late")[0], rec.Latencies("now")[0]; late < time.Hour || now >= time.Hour {
		t.Errorf("latency due an hour ago %v (want over an hour), sent now %v", late, now)
	}
}
