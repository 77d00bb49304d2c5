package engine_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/engine"
)

// flakyStore fails every write while failing is set: a store that is
// unreachable for a while.
type flakyStore struct {
	dbcloud.Store
	failing atomic.Bool
}

func (s *flakyStore) Update(ctx context.Context, fn func(dbcloud.Tx) error) error {
	if s.failing.Load() {
		return errors.New("store unreachable")
	}
	return s.Store.Update(ctx, fn)
}

// heldWork is a provisioner whose ensure runs until released or until its
// context ends, and says which.
type heldWork struct {
	*provisioner
	entered   chan struct{}
	release   chan struct{}
	cancelled atomic.Bool
}

func (h *heldWork) EnsureService(ctx context.Context, s *dbcloud.Service) (*dbcloud.Observation, error) {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	select {
	case <-h.release:
	case <-ctx.Done():
		h.cancelled.Store(true)
		return nil, ctx.Err()
	}
	return h.provisioner.EnsureService(ctx, s)
}

func (h *heldWork) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-h.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine did not start the work within 30 s")
	}
}

func (f *fixture) heldEngine(t *testing.T, store dbcloud.Store, h *heldWork) {
	t.Helper()
	e := engine.New(store, h, "plane", slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval, e.LeaseTTL = 20*time.Millisecond, time.Hour, 1500*time.Millisecond
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	f.cloud.Notify = e.Notify
	t.Cleanup(func() { e.Close() })
}

// TestEngine_LeaseSurvivesAStoreHiccup: renewals that fail for less than
// the lease's margin do not stop the work.
func TestEngine_LeaseSurvivesAStoreHiccup(t *testing.T) {
	f := newFixture(t)
	store := &flakyStore{Store: f.store}
	h := &heldWork{provisioner: f.prov, entered: make(chan struct{}, 1), release: make(chan struct{})}
	f.heldEngine(t, store, h)
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "hiccup"})
	if err != nil {
		t.Fatal(err)
	}
	h.waitEntered(t)
	// Renewals come every 500 ms: an outage of 450 ms makes one fail
	// (most likely) and never two, which would be two thirds of the TTL.
	store.failing.Store(true)
	time.Sleep(450 * time.Millisecond) // the outage being simulated
	store.failing.Store(false)
	time.Sleep(time.Second) // renewals succeed again meanwhile
	close(h.release)
	f.waitStatus(t, v.Service.ID, dbcloud.StatusReady)
	if h.cancelled.Load() {
		t.Error("the work was stopped by a short store outage")
	}
}

// TestEngine_LeaseOutageStopsWork: when renewals keep failing, the work
// is stopped (before the lease can expire and another plane take it).
func TestEngine_LeaseOutageStopsWork(t *testing.T) {
	f := newFixture(t)
	store := &flakyStore{Store: f.store}
	h := &heldWork{provisioner: f.prov, entered: make(chan struct{}, 1), release: make(chan struct{})}
	f.heldEngine(t, store, h)
	if _, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "outage"}); err != nil {
		t.Fatal(err)
	}
	h.waitEntered(t)
	store.failing.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	for !h.cancelled.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the work went on for 10 s without a renewed lease")
		}
		time.Sleep(10 * time.Millisecond)
	}
	store.failing.Store(false)
	close(h.release)
}
