package engine_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/cloud"
	"dbcloud/engine"
	"dbcloud/storetest"
)

// TestEngine_WakeFailedPausesAgain: a wake whose start fails (the
// instance's disk full) is not retried into a start nobody waits for: the
// service goes back to PAUSED, still auto-paused, with the wake failed and
// nothing pending, and the runtime was asked to hold it paused again under
// a newer generation (so that it takes its endpoints back); the next wake
// succeeds.
// TestEngine_WakeWaitsForNothingElse: a client holds its connection open
// while its service wakes, so a wake does not wait for an engine worker
// that other work (here a resize held in the runtime) has taken.
func TestEngine_WakeWaitsForNothingElse(t *testing.T) {
	f := newFixture(t)
	f.engineWith(t, "a", func(e *engine.Engine) { e.Workers = 1 })
	var ids []string
	for _, name := range []string{"paused", "busy"} {
		v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.Service.ID)
		f.waitStatus(t, v.Service.ID, dbcloud.StatusReady)
	}
	paused, busy := ids[0], ids[1]
	if _, err := f.cloud.SetAutoPause(f.ctx, f.pid, paused, 60); err != nil {
		t.Fatal(err)
	}
	f.pausedByIdleClock(t, paused)
	hold := make(chan struct{})
	defer close(hold)
	f.prov.mu.Lock()
	f.prov.blockOf[busy] = hold
	f.prov.mu.Unlock()
	if _, err := f.cloud.ResizeService(f.ctx, f.pid, busy, "1000", "4"); err != nil {
		t.Fatal(err)
	}
	// The one worker is in the runtime for the resize.
	f.waitFor(t, busy, "the resize held in the runtime", func(*cloud.ServiceView, error) bool {
		f.prov.mu.Lock()
		defer f.prov.mu.Unlock()
		return f.prov.held[busy] > 0
	})
	if err := f.cloud.WakeService(t.Context(), f.pid, paused); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, paused, dbcloud.StatusReady)
	if v, err := f.cloud.GetService(f.ctx, f.pid, busy); err != nil || v.Service.Status != dbcloud.StatusConfiguring {
		t.Errorf("the resize held in the runtime: %v, want CONFIGURING", err)
	}
}

func TestEngine_WakeFailedPausesAgain(t *testing.T) {
	f := newFixture(t)
	f.engine(t, "a")
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusReady)
	if _, err := f.cloud.SetAutoPause(f.ctx, f.pid, id, 60); err != nil {
		t.Fatal(err)
	}
	f.pausedByIdleClock(t, id)

	full := dbcloud.Errorf(dbcloud.KindUnavailable, "The disk holding this service's data is full.")
	f.prov.mu.Lock()
	f.prov.fail[id] = []error{full}
	f.prov.mu.Unlock()
	if err := f.cloud.WakeService(t.Context(), f.pid, id); err != nil {
		t.Fatal(err)
	}
	got := f.waitFor(t, id, "PAUSED with nothing pending after the failed wake", func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.Status == dbcloud.StatusPaused && len(f.pending(t, id)) == 0
	})
	if !got.Service.AutoPaused() {
		t.Errorf("after a failed wake: running %v paused_at %v, want auto-paused", got.Service.Spec.Running, got.Service.PausedAt)
	}
	var wake *dbcloud.Operation
	f.store.View(t.Context(), func(tx dbcloud.Tx) error {
		ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: id})
		for _, op := range ops {
			if op.Type == dbcloud.OpWake {
				wake = op
			}
		}
		return err
	})
	if wake == nil || wake.Type != dbcloud.OpWake || wake.State != dbcloud.OpFailed || wake.Error != full.Message {
		t.Errorf("last operation %+v, want the wake failed with the disk's reason", wake)
	}
	f.prov.mu.Lock()
	last, running := f.prov.last[id], f.prov.running[id]
	f.prov.mu.Unlock()
	if running || !last.AutoPaused() || last.Generation != got.Service.Generation {
		t.Errorf("the runtime was last asked for running %v auto-paused %v at generation %d (service at %d); want it held paused at the service's generation",
			running, last.AutoPaused(), last.Generation, got.Service.Generation)
	}

	if err := f.cloud.WakeService(t.Context(), f.pid, id); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, id, dbcloud.StatusReady)
}

// pausedByIdleClock records the service as the engine's autoPause and
// its operation leave it: auto-paused at 60 s, PAUSED, nothing pending.
func (f *fixture) pausedByIdleClock(t *testing.T, id string) {
	t.Helper()
	now := time.Now()
	if err := f.store.Update(t.Context(), func(tx dbcloud.Tx) error {
		if err := storetest.SucceedPending(tx, id); err != nil {
			return err
		}
		s, err := tx.FindService(f.pid, id)
		if err != nil {
			return err
		}
		s.AutoPause = &dbcloud.AutoPause{IdleSeconds: 60}
		s.Spec.Running, s.PausedAt, s.Status = false, &now, dbcloud.StatusPaused
		s.Generation++
		s.ObservedGeneration = s.Generation
		return tx.UpdateService(s)
	}); err != nil {
		t.Fatal(err)
	}
}

// waker is the stand-in runtime with the Waker capability: it records the
// services whose endpoints it was asked to hold.
type waker struct {
	*provisioner
	opened atomic.Bool // set by the test once Open returned
	mu     sync.Mutex
	before []string // services held before Open returned
}

func (w *waker) SetWakeHandler(dbcloud.WakeHandler) {}

func (w *waker) HoldPaused(_ context.Context, svc *dbcloud.Service) error {
	if !w.opened.Load() {
		w.mu.Lock()
		w.before = append(w.before, svc.ID)
		w.mu.Unlock()
	}
	return nil
}

// TestEngine_OpenHoldsPausedEndpoints: after a restart of dbcloud the
// auto-paused services' endpoints are held before Open returns, so before
// the API answers: a client that sees the new process answer and then
// connects to a paused service wakes it instead of being refused (the
// health loop's first round, in a goroutine of its own, came too late for
// clients that waited on the API).
func TestEngine_OpenHoldsPausedEndpoints(t *testing.T) {
	f := newFixture(t)
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	id := v.Service.ID
	f.pausedByIdleClock(t, id) // the create done by an engine before the restart

	w := &waker{provisioner: f.prov}
	e := engine.New(f.store, w, "a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	w.opened.Store(true)
	t.Cleanup(func() { e.Close() })
	w.mu.Lock()
	defer w.mu.Unlock()
	// The health loop's first round holds it too, but in a goroutine of
	// its own, which may run after Open returned: only a hold before
	// counts.
	if !slices.Contains(w.before, id) {
		t.Errorf("held before Open returned: %q, want %s", w.before, id)
	}
}
