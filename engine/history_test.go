package engine_test

import (
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/engine"
)

// TestEngine_RecordsHistory: the health loop's samples reach the history,
// and each reconcile is reported to Observe.
func TestEngine_RecordsHistory(t *testing.T) {
	f := newFixture(t)
	e := engine.New(f.store, f.prov, "a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval, e.MetricsInterval = 20*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond
	e.History = f.cloud.History
	var mu sync.Mutex
	reconciles := map[string]int{}
	e.Observe = func(kind string, d time.Duration, err error) {
		mu.Lock()
		reconciles[kind]++
		mu.Unlock()
	}
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	f.cloud.Notify = e.Notify
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, v.Service.ID, dbcloud.StatusReady)
	deadline := time.Now().Add(20 * time.Second)
	for {
		rows, err := f.cloud.History.Store.ListSeriesRows(t.Context(), v.Service.ID, dbcloud.SeriesMemoryUsage, time.Minute,
			time.Unix(0, 0), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		// Two rounds at least: the samples are merged, not replaced.
		if len(rows) > 0 && rows[len(rows)-1].Count >= 2 {
			if rows[0].Last != 18<<20 {
				t.Errorf("memory sample %g, want %d bytes", rows[0].Last, 18<<20)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no memory samples in the history after 20 s: %+v", rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A deleted service's history goes with it.
	if err := f.cloud.DeleteService(f.ctx, f.pid, v.Service.ID); err != nil {
		t.Fatal(err)
	}
	for {
		n, err := f.cloud.History.Store.CountSeriesRows(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d history rows left after the delete", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if reconciles["service"] == 0 {
		t.Errorf("Observe saw reconciles %v, want the create's", reconciles)
	}
	if n := e.LeasesHeld(); n < 0 || n > 1 {
		t.Errorf("LeasesHeld = %d with one service", n)
	}
}
