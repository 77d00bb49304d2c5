package engine_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/cloud"
	"dbcloud/engine"
)

// roleKeeper stands in for the runtime's credential roles: it keeps what
// each service was last synced to, as the runtime would keep roles.
type roleKeeper struct {
	mu    sync.Mutex
	roles map[string][]dbcloud.CredentialRole
	syncs map[string]int
}

func (k *roleKeeper) SyncCredentials(_ context.Context, s *dbcloud.Service, live []dbcloud.CredentialRole) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.roles[s.ID] = live
	k.syncs[s.ID]++
	return nil
}

func (k *roleKeeper) CredentialLogins(context.Context, *dbcloud.Service) (map[string]time.Time, error) {
	return nil, nil
}

func (k *roleKeeper) of(id string) ([]dbcloud.CredentialRole, int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.roles[id], k.syncs[id]
}

// credProvisioner and credRuntime give the engine and the domain one
// roleKeeper, as one runtime implements both sides.
type credProvisioner struct {
	*provisioner
	*roleKeeper
}

type credRuntime struct {
	stubRuntime
	*roleKeeper
}

// TestEngine_Credentials: the engine keeps a service's credential roles
// the live credentials where no request does it: an expired credential's
// role is dropped by the round (recorded as expire_credential, the row
// forgotten), a fork drops the roles its parent's data brought before it
// shows READY, and a credential revoked while the service was stopped is
// dropped by the start before the service serves again.
func TestEngine_Credentials(t *testing.T) {
	f := newFixture(t)
	keeper := &roleKeeper{roles: map[string][]dbcloud.CredentialRole{}, syncs: map[string]int{}}
	f.cloud.Runtime = credRuntime{roleKeeper: keeper}
	prov := f.prov
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	f.cloud.Now = now
	f.engineWith(t, "a", func(e *engine.Engine) {
		e.Provisioner = credProvisioner{provisioner: prov, roleKeeper: keeper}
		e.CredentialInterval = 20 * time.Millisecond
		e.Now = now
	})
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusReady)
	if _, n := keeper.of(id); n != 0 {
		t.Errorf("a new service without credentials was synced %d times", n)
	}

	short, err := f.cloud.CreateCredential(f.ctx, f.pid, id, cloud.CredentialCreate{Name: "short", TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	long, err := f.cloud.CreateCredential(f.ctx, f.pid, id, cloud.CredentialCreate{Name: "long", Access: "READ_WRITE", TTLSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if roles, _ := keeper.of(id); len(roles) != 2 {
		t.Fatalf("roles after two creates: %+v", roles)
	}

	// A fork of it: its data holds both roles; its ensure drops them.
	fork, err := f.cloud.ForkService(f.ctx, f.pid, id, cloud.ServiceFork{Strategy: "NOW"})
	if err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, fork.Service.ID, dbcloud.StatusReady)
	if roles, n := keeper.of(fork.Service.ID); n == 0 || len(roles) != 0 {
		t.Errorf("the fork's roles: %+v after %d syncs, want none after at least one", roles, n)
	}

	// 61 s later the short one has expired: the round drops it.
	skew.Store(int64(61 * time.Second))
	waitUntil(t, "the expired credential's role dropped and its row forgotten", func() bool {
		roles, _ := keeper.of(id)
		var rows []*dbcloud.Credential
		f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
			rows, err = tx.ListCredentials(f.pid, id)
			return err
		})
		return len(roles) == 1 && roles[0].Username == long.Username() && len(rows) == 1
	})
	var expired []*dbcloud.Operation
	f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
		expired, err = tx.ListOperations(dbcloud.OperationFilter{ResourceID: short.ID})
		return err
	})
	kinds := map[dbcloud.OperationType]dbcloud.OperationState{}
	for _, op := range expired {
		kinds[op.Type] = op.State
	}
	if kinds[dbcloud.OpCreateCredential] != dbcloud.OpSucceeded || kinds[dbcloud.OpExpireCredential] != dbcloud.OpSucceeded {
		t.Errorf("operations of the expired credential: %v", kinds)
	}

	// Revoked while stopped: recorded at once, dropped by the start.
	if _, err := f.cloud.StopService(f.ctx, f.pid, id); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, id, dbcloud.StatusPaused)
	if err := f.cloud.RevokeCredential(f.ctx, f.pid, id, long.ID); err != nil {
		t.Fatal(err)
	}
	if roles, _ := keeper.of(id); len(roles) != 1 {
		t.Fatalf("a stopped service's roles changed at the revoke: %+v", roles)
	}
	if _, err := f.cloud.StartService(f.ctx, f.pid, id); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, id, dbcloud.StatusReady)
	if roles, _ := keeper.of(id); len(roles) != 0 {
		t.Errorf("roles after the start: %+v, want the revoked one dropped", roles)
	}
}

// waitUntil polls cond until it holds, or fails after a deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
