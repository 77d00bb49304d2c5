package engine_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/engine"
)

// staleCheck is a provisioner whose next CheckService, once armed, says
// the primary is down while it runs: what a plane sees just before
// another plane's repair (or reconcile) is done.
type staleCheck struct {
	*provisioner
	mu     sync.Mutex
	armed  bool
	checks int // CheckService calls since arming
}

func (s *staleCheck) CheckService(ctx context.Context, svc *dbcloud.Service, measure bool) (*dbcloud.Observation, error) {
	s.mu.Lock()
	armed := s.armed
	s.armed = false
	s.checks++
	s.mu.Unlock()
	if armed {
		return &dbcloud.Observation{Running: false, Reason: "stale"}, nil
	}
	return s.provisioner.CheckService(ctx, svc, measure)
}

func (s *staleCheck) arm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed, s.checks = true, 0
}

func (s *staleCheck) checked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checks
}

// TestEngine_RepairLooksAgainUnderTheLease: a service seen down that runs
// again once the lease is held is not repaired: no second decider
// reconciles a service another plane has just fixed.
func TestEngine_RepairLooksAgainUnderTheLease(t *testing.T) {
	f := newFixture(t)
	sc := &staleCheck{provisioner: f.prov}
	e := engine.New(f.store, sc, "a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval, e.MetricsInterval = 20*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	f.cloud.Notify = e.Notify
	t.Cleanup(func() { e.Close() })
	v, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusReady)
	before := f.prov.count(id)
	sc.arm()
	// The stale check, the look under the lease, and one more health
	// check: the repair has been decided (or not) by then.
	for deadline := time.Now().Add(10 * time.Second); sc.checked() < 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the health loop did not check the service three times within 10 s")
		}
	}
	if n := f.prov.count(id) - before; n != 0 {
		t.Errorf("a service running again under the lease was reconciled %d times, want 0", n)
	}
	if got, _ := f.cloud.GetService(f.ctx, f.pid, id); got.Service.Status != dbcloud.StatusReady {
		t.Errorf("status %s, want READY throughout", got.Service.Status)
	}
}
