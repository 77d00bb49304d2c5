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

// watching is a provisioner that tells the engine of failures as they
// happen (dbcloud.FailureWatcher).
type watching struct {
	*provisioner
	mu     sync.Mutex
	notify func(projectID, serviceID string)
}

func (w *watching) WatchFailures(notify func(projectID, serviceID string)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.notify = notify
}

// fail makes the service's primary die and tells the engine, as the local
// runtime does when a watched postmaster exits.
func (w *watching) fail(projectID, id string) {
	w.provisioner.mu.Lock()
	w.provisioner.running[id] = false
	w.provisioner.mu.Unlock()
	w.mu.Lock()
	notify := w.notify
	w.mu.Unlock()
	if notify != nil {
		notify(projectID, id)
	}
}

// TestEngine_RepairsOnFailureNotice: a failure the runtime reports is
// repaired from the notice, without waiting for a health round (there is
// none within the test: the interval is an hour), and recorded like the
// health loop's repairs.
func TestEngine_RepairsOnFailureNotice(t *testing.T) {
	f := newFixture(t)
	w := &watching{provisioner: f.prov}
	e := engine.New(f.store, w, "a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval = 20*time.Millisecond, time.Hour
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	f.cloud.Notify = e.Notify
	t.Cleanup(func() { e.Close() })
	v, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusReady)
	before := f.prov.count(id)

	w.fail(f.pid, id)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		f.prov.mu.Lock()
		running := f.prov.running[id]
		f.prov.mu.Unlock()
		if running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not repaired within 30 s of the failure notice (%d ensures since)", f.prov.count(id)-before)
		}
	}
	f.waitStatus(t, id, dbcloud.StatusReady)
	var ops []*dbcloud.Operation
	f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
		ops, err = tx.ListOperations(dbcloud.OperationFilter{ResourceID: id})
		return err
	})
	var repairs int
	for _, op := range ops {
		if op.Type == dbcloud.OpRestartPrimary {
			repairs++
		}
	}
	if repairs != 1 {
		t.Errorf("%d restart_primary operations recorded, want 1", repairs)
	}

	t.Run("NotWatchedAfterClose", func(t *testing.T) {
		e.Close()
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.notify != nil {
			t.Error("the engine still listens to failures after Close")
		}
	})
}
