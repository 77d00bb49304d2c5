package http_test

import (
	"context"
	"sync/atomic"
	"testing"

	"dbcloud"
)

// trackingStore marks when a transaction is open.
type trackingStore struct {
	dbcloud.Store
	open *atomic.Int32
}

func (s trackingStore) View(ctx context.Context, fn func(dbcloud.Tx) error) error {
	return s.Store.View(ctx, func(tx dbcloud.Tx) error { s.open.Add(1); defer s.open.Add(-1); return fn(tx) })
}

func (s trackingStore) Update(ctx context.Context, fn func(dbcloud.Tx) error) error {
	return s.Store.Update(ctx, func(tx dbcloud.Tx) error { s.open.Add(1); defer s.open.Add(-1); return fn(tx) })
}

// trackingNetwork fails the test when it is called inside a transaction.
type trackingNetwork struct {
	t     *testing.T
	open  *atomic.Int32
	calls *atomic.Int32
}

func (n trackingNetwork) check(what string) {
	n.calls.Add(1)
	if n.open.Load() > 0 {
		n.t.Errorf("network %s called inside a store transaction", what)
	}
}
func (n trackingNetwork) CreateVPC(context.Context, *dbcloud.VPC) error {
	n.check("CreateVPC")
	return nil
}
func (n trackingNetwork) DeleteVPC(context.Context, *dbcloud.VPC) error {
	n.check("DeleteVPC")
	return nil
}
func (n trackingNetwork) CreatePeering(context.Context, *dbcloud.VPC, *dbcloud.Peering) (string, error) {
	n.check("CreatePeering")
	return "pcx-1", nil
}
func (n trackingNetwork) DeletePeering(context.Context, *dbcloud.VPC, *dbcloud.Peering) error {
	n.check("DeletePeering")
	return nil
}
func (n trackingNetwork) Attach(context.Context, *dbcloud.VPC, *dbcloud.Service) (*dbcloud.VPCEndpoint, error) {
	n.check("Attach")
	return nil, nil
}
func (n trackingNetwork) Detach(context.Context, *dbcloud.VPC, *dbcloud.Service) error {
	n.check("Detach")
	return nil
}

// TestNoRuntimeOrNetworkCallsInTransactions: requests that touch the
// runtime (ports, host capacity, a tenant's database) or the network do so
// outside any store transaction, so a slow tenant or provider holds up no
// other project's writes (issue 14). Requests run one at a time, so an open
// transaction seen by a call is the caller's own.
func TestNoRuntimeOrNetworkCallsInTransactions(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		open, calls := new(atomic.Int32), new(atomic.Int32)
		e.cloud.Store = trackingStore{Store: e.cloud.Store, open: open}
		e.cloud.Network = trackingNetwork{t: t, open: open, calls: calls}
		check := func(what string) {
			calls.Add(1)
			if open.Load() > 0 {
				t.Errorf("runtime %s called inside a store transaction", what)
			}
		}
		e.runtime.portFree = func(int) bool { check("PortFree"); return true }
		e.runtime.hostCheck = func() { check("HostCapacity") }
		e.runtime.setPassword = func(context.Context, *dbcloud.Service, string) error { check("SetPassword"); return nil }

		s := e.readyService(map[string]any{"name": "tx"})
		path := e.pa() + "/services/" + s.ServiceID
		e.want(202, "", req{Method: "POST", Path: path + "/resize", Body: map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}})
		e.settle(s.ServiceID, dbcloud.StatusReady)
		e.want(202, "", req{Method: "POST", Path: path + "/setHA", Body: map[string]int{"replica_count": 1}})
		e.settle(s.ServiceID, dbcloud.StatusReady)
		e.want(200, "", req{Method: "POST", Path: path + "/enablePooler"})
		e.settle(s.ServiceID, dbcloud.StatusReady)
		e.want(202, "", req{Method: "POST", Path: path + "/replicaSets", Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}})
		e.want(204, "", req{Method: "POST", Path: path + "/updatePassword", Body: map[string]string{"password": "a-long-password"}})
		e.want(202, "", req{Method: "POST", Path: path + "/forkService", Body: map[string]string{"fork_strategy": "LAST_SNAPSHOT"}})
		var v struct{ ID string }
		e.want(201, "", req{Method: "POST", Path: e.pa() + "/vpcs", Body: map[string]string{"name": "n", "cidr": "10.3.0.0/16", "region_code": "local"}}).decode(t, &v)
		e.want(204, "", req{Method: "DELETE", Path: e.pa() + "/vpcs/" + v.ID})
		if calls.Load() < 10 {
			t.Errorf("only %d runtime and network calls were seen; the test does not exercise them", calls.Load())
		}
	})
}
