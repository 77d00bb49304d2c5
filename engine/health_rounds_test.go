package engine_test

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/cloud"
	"dbcloud/engine"
)

// listCountingStore counts the lists of services its transactions read.
type listCountingStore struct {
	dbcloud.Store
	lists atomic.Int64
}

func (s *listCountingStore) View(ctx context.Context, fn func(dbcloud.Tx) error) error {
	return s.Store.View(ctx, func(tx dbcloud.Tx) error { return fn(listCountingTx{tx, &s.lists}) })
}

func (s *listCountingStore) Update(ctx context.Context, fn func(dbcloud.Tx) error) error {
	return s.Store.Update(ctx, func(tx dbcloud.Tx) error { return fn(listCountingTx{tx, &s.lists}) })
}

type listCountingTx struct {
	dbcloud.Tx
	lists *atomic.Int64
}

func (t listCountingTx) ListServices(projectID string) ([]*dbcloud.Service, error) {
	t.lists.Add(1)
	return t.Tx.ListServices(projectID)
}

// TestHealth_IdleRoundsCostNoListAndNoWrite: while nothing changes, the
// health loop's rounds check the running services from the list it read
// last rather than read every service again each round (at 2,000 services
// that read was most of an idle control plane's CPU), and a stopped
// service is neither checked nor written.
func TestHealth_IdleRoundsCostNoListAndNoWrite(t *testing.T) {
	f := newFixture(t)
	counting := &listCountingStore{Store: f.store}
	f.engineWith(t, "a", func(e *engine.Engine) {
		e.Store, e.MetricsInterval, e.BackupInterval = counting, time.Hour, 0
	})
	ready, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "ready"})
	parked, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "parked"})
	f.waitStatus(t, ready.Service.ID, dbcloud.StatusReady)
	f.waitStatus(t, parked.Service.ID, dbcloud.StatusReady)
	if _, err := f.cloud.StopService(f.ctx, f.pid, parked.Service.ID); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, parked.Service.ID, dbcloud.StatusPaused)
	checks := func(id string) int {
		f.prov.mu.Lock()
		defer f.prov.mu.Unlock()
		return f.prov.checks[id]
	}
	waitChecks := func(n int) {
		t.Helper()
		want := checks(ready.Service.ID) + n
		for deadline := time.Now().Add(10 * time.Second); checks(ready.Service.ID) < want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d health checks of the READY service, want %d", checks(ready.Service.ID), want)
			}
		}
	}
	waitChecks(2) // the stop's worker has ended
	lists, parkedChecks := counting.lists.Load(), checks(parked.Service.ID)
	stored := f.service(t, parked.Service.ID)
	const rounds = 10
	waitChecks(rounds)
	if n := counting.lists.Load() - lists; n > 1 {
		t.Errorf("%d lists of the services over %d idle health rounds, want at most 1", n, rounds)
	}
	if n := checks(parked.Service.ID) - parkedChecks; n != 0 {
		t.Errorf("the stopped service was checked %d times", n)
	}
	if got := f.service(t, parked.Service.ID); !reflect.DeepEqual(got, stored) {
		t.Errorf("the stopped service was written:\n%+v\nwas\n%+v", got, stored)
	}
}

// service reads a service as the store holds it.
func (f *fixture) service(t *testing.T, id string) *dbcloud.Service {
	t.Helper()
	var svc *dbcloud.Service
	if err := f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
		svc, err = tx.FindService(f.pid, id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return svc
}
