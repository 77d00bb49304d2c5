package engine_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/cloud"
	"dbcloud/engine"
)

// replicas is a stand-in runtime that also provisions read replica sets:
// it remembers which sets run and can fail a set's next Ensure calls, by
// the set's name (its ID is not known before it is created).
type replicas struct {
	*provisioner
	mu      sync.Mutex
	running map[string]bool    // by set ID
	fail    map[string][]error // by set name
	deleted map[string]bool    // by set ID
}

func (r *replicas) EnsureReplicaSet(_ context.Context, _ *dbcloud.Service, set *dbcloud.ReadReplicaSet) (*dbcloud.Observation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if errs := r.fail[set.Name]; len(errs) > 0 {
		r.fail[set.Name] = errs[1:]
		return nil, errs[0]
	}
	r.running[set.ID] = true
	return &dbcloud.Observation{Running: true, Endpoint: &dbcloud.Endpoint{Host: "replicas.test", Port: 6001}}, nil
}

func (r *replicas) DeleteReplicaSet(_ context.Context, _ *dbcloud.Service, set *dbcloud.ReadReplicaSet) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deleted[set.ID] = true
	delete(r.running, set.ID)
	return nil
}

func (r *replicas) CheckReplicaSet(_ context.Context, _ *dbcloud.Service, set *dbcloud.ReadReplicaSet) (*dbcloud.Observation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[set.ID] {
		return &dbcloud.Observation{Running: true}, nil
	}
	return &dbcloud.Observation{Reason: "A replica node stopped."}, nil
}

// stop makes the set's nodes die, failing the next n repairs with cause.
func (r *replicas) stop(set *dbcloud.ReadReplicaSet, n int, cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.running, set.ID)
	for range n {
		r.fail[set.Name] = append(r.fail[set.Name], cause)
	}
}

func (r *replicas) failNext(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail[name] = append(r.fail[name], err)
}

func (r *replicas) wasDeleted(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deleted[id]
}

// replicaFixture runs an engine over replicas, with one READY service to
// hang read replica sets on.
func replicaFixture(t *testing.T) (*fixture, *replicas, string) {
	t.Helper()
	f := newFixture(t)
	rp := &replicas{provisioner: f.prov, running: map[string]bool{}, fail: map[string][]error{}, deleted: map[string]bool{}}
	e := engine.New(f.store, rp, "a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval, e.MetricsInterval = 20*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond
	e.LeaseTTL = 1500 * time.Millisecond
	e.MaxAttempts = 3
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	f.cloud.Notify = e.Notify
	t.Cleanup(func() { e.Close() })
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, v.Service.ID, dbcloud.StatusReady)
	return f, rp, v.Service.ID
}

// waitSet polls the stored set until cond holds (nil: it is gone), or
// fails after a deadline.
func (f *fixture) waitSet(t *testing.T, id, what string, cond func(r *dbcloud.ReadReplicaSet) bool) *dbcloud.ReadReplicaSet {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var set *dbcloud.ReadReplicaSet
		err := f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
			set, err = tx.FindReplicaSet(f.pid, id)
			if dbcloud.IsNotFound(err) {
				set, err = nil, nil
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if cond(set) {
			return set
		}
		if time.Now().After(deadline) {
			st := "gone"
			if set != nil {
				st = string(set.Status) + " " + set.StatusReason
			}
			t.Fatalf("read replica set %s: %s not reached; now %s", id, what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func hasStatus(st dbcloud.ReplicaSetStatus, reason string) func(r *dbcloud.ReadReplicaSet) bool {
	return func(r *dbcloud.ReadReplicaSet) bool { return r != nil && r.Status == st && r.StatusReason == reason }
}

// TestEngine_ReplicaSetLifecycle: a read replica set is created to active
// with its endpoint and operation ended, shown error while a dead node
// cannot be restarted, active again once it can, and deleted with its
// ports.
func TestEngine_ReplicaSetLifecycle(t *testing.T) {
	f, rp, svcID := replicaFixture(t)
	r, err := f.cloud.CreateReplicaSet(f.ctx, f.pid, svcID, cloud.ReplicaSetCreate{Name: "reads", CPUMillis: 500, MemoryGBs: 2, Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	got := f.waitSet(t, r.ID, "active", hasStatus(dbcloud.ReplicaSetActive, ""))
	if got.ObservedGeneration != got.Generation || got.Endpoint == nil || got.Endpoint.Host != "replicas.test" || len(f.pending(t, r.ID)) != 0 {
		t.Errorf("active with observed %d of %d, endpoint %+v, %d pending",
			got.ObservedGeneration, got.Generation, got.Endpoint, len(f.pending(t, r.ID)))
	}

	rp.stop(got, 1000, errors.New("no room for the node"))
	f.waitSet(t, r.ID, "error while the node cannot start", hasStatus(dbcloud.ReplicaSetError, "A replica node stopped."))
	rp.mu.Lock()
	rp.fail[got.Name] = nil
	rp.mu.Unlock()
	f.waitSet(t, r.ID, "active after the repair", hasStatus(dbcloud.ReplicaSetActive, ""))

	if err := f.cloud.DeleteReplicaSet(f.ctx, f.pid, svcID, r.ID); err != nil {
		t.Fatal(err)
	}
	f.waitSet(t, r.ID, "gone", func(r *dbcloud.ReadReplicaSet) bool { return r == nil })
	if !rp.wasDeleted(r.ID) || len(f.pending(t, r.ID)) != 0 {
		t.Errorf("runtime asked to delete: %v; %d operations pending", rp.wasDeleted(r.ID), len(f.pending(t, r.ID)))
	}
	var ports map[int]string
	f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) { ports, err = tx.ListPorts(); return err })
	for p, owner := range ports {
		if owner == r.ID {
			t.Errorf("port %d still held by the deleted set", p)
		}
	}
}

// TestEngine_ReplicaSetTerminalFailure: a terminal error is not retried:
// the set shows error with the error's message and its operation fails
// with it.
func TestEngine_ReplicaSetTerminalFailure(t *testing.T) {
	f, rp, svcID := replicaFixture(t)
	const msg = "The host has no room for this read replica set."
	rp.failNext("reads", dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindUnavailable, msg)))
	r, err := f.cloud.CreateReplicaSet(f.ctx, f.pid, svcID, cloud.ReplicaSetCreate{Name: "reads", CPUMillis: 500, MemoryGBs: 2, Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.waitSet(t, r.ID, "error", hasStatus(dbcloud.ReplicaSetError, msg))
	var ops []*dbcloud.Operation
	f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
		ops, err = tx.ListOperations(dbcloud.OperationFilter{ResourceID: r.ID})
		return err
	})
	if len(ops) != 1 || ops[0].State != dbcloud.OpFailed || ops[0].Error != msg {
		t.Errorf("operations of the set: %+v; want one failed with %q", ops, msg)
	}
}
