package engine_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"dbcloud"
	"dbcloud/cloud"
)

// syncBuffer is a log destination the test reads while the engine writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestEngine_PanicInReconcile: a runtime that panics while it ensures one
// service costs that service an attempt, not the process: the other
// service reaches READY, the panic is logged with the service it hit, and
// the panicking service is retried with its backoff until it works.
func TestEngine_PanicInReconcile(t *testing.T) {
	f := newFixture(t)
	bad, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "bad"})
	if err != nil {
		t.Fatal(err)
	}
	good, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "good"})
	if err != nil {
		t.Fatal(err)
	}
	badID := bad.Service.ID
	f.prov.mu.Lock()
	f.prov.panics[badID] = 2 // under the fixture's MaxAttempts of 3
	f.prov.mu.Unlock()
	logs := &syncBuffer{}
	f.engineLogging(t, "a", slog.New(slog.NewTextHandler(logs, nil)))

	f.waitStatus(t, good.Service.ID, dbcloud.StatusReady)
	f.waitStatus(t, badID, dbcloud.StatusReady)
	if n := f.prov.count(badID); n != 3 {
		t.Errorf("%d ensures of the panicking service; want 3 (two panics, then the one that worked)", n)
	}
	var ops []*dbcloud.Operation
	f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
		ops, err = tx.ListOperations(dbcloud.OperationFilter{ResourceID: badID})
		return err
	})
	if len(ops) != 1 {
		t.Fatalf("%d operations; want the create", len(ops))
	}
	if got := ops[0]; got.Attempts != 2 || got.State != dbcloud.OpSucceeded {
		t.Errorf("create %s after %d failed attempts; want succeeded after 2", got.State, got.Attempts)
	}
	var panicked, retried bool
	for _, line := range strings.Split(logs.String(), "\n") {
		if !strings.Contains(line, badID) {
			continue
		}
		panicked = panicked || (strings.Contains(line, "level=ERROR") && strings.Contains(line, "assignment to entry in nil map") && strings.Contains(line, "stack="))
		retried = retried || (strings.Contains(line, "reconcile failed; retrying") && strings.Contains(line, "panic"))
	}
	if !panicked || !retried {
		t.Errorf("logs (panic logged %v, retry says it panicked %v):\n%s", panicked, retried, logs.String())
	}
}

// TestEngine_PanicInHealthCheck: a runtime whose check of one service
// panics every time costs that service its checks, not the health loop:
// the service listed after it still has its dead primary repaired, and the
// panicking one is checked again in later rounds.
func TestEngine_PanicInHealthCheck(t *testing.T) {
	f := newFixture(t)
	logs := &syncBuffer{}
	f.engineLogging(t, "a", slog.New(slog.NewTextHandler(logs, nil)))
	bad, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "bad"}) // listed first
	good, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "good"})
	badID, goodID := bad.Service.ID, good.Service.ID
	f.waitStatus(t, badID, dbcloud.StatusReady)
	f.waitStatus(t, goodID, dbcloud.StatusReady)

	f.prov.mu.Lock()
	f.prov.checkPanics[badID] = true
	f.prov.block = make(chan struct{}) // hold the repair so UNSTABLE is visible
	f.prov.running[goodID] = false
	f.prov.mu.Unlock()
	f.waitStatus(t, goodID, dbcloud.StatusUnstable)
	f.prov.mu.Lock()
	close(f.prov.block)
	f.prov.mu.Unlock()
	f.waitStatus(t, goodID, dbcloud.StatusReady)

	f.prov.mu.Lock()
	f.prov.checks[badID] = 0
	f.prov.mu.Unlock()
	f.waitFor(t, badID, "checked again after its panics", func(*cloud.ServiceView, error) bool {
		f.prov.mu.Lock()
		defer f.prov.mu.Unlock()
		return f.prov.checks[badID] >= 2
	})
	if !strings.Contains(logs.String(), "nil pointer dereference") || !strings.Contains(logs.String(), "resource="+badID) {
		t.Errorf("no panic logged with the service:\n%s", logs.String())
	}
}
