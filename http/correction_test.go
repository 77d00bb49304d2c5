package http_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"dbcloud"
)

// failing marks the resource's pending operations as failed attempts, as
// the engine does while a change keeps failing.
func (e *env) failing(id string) {
	e.t.Helper()
	err := e.store.Update(context.Background(), func(tx dbcloud.Tx) error {
		ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: id, Pending: true})
		if err != nil {
			return err
		}
		for _, op := range ops {
			op.Attempts, op.Error = 3, "could not map anonymous shared memory"
			if err := tx.UpdateOperation(op); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) operations(id string) (pending, superseded int) {
	e.t.Helper()
	e.store.View(context.Background(), func(tx dbcloud.Tx) error {
		ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: id})
		for _, op := range ops {
			switch op.State {
			case dbcloud.OpPending:
				pending++
			case dbcloud.OpSuperseded:
				superseded++
			}
		}
		return err
	})
	return pending, superseded
}

// TestCorrections: a user can always correct: a new resize supersedes a
// failing one, and stop, resize, setHA down and disablePooler are accepted
// on an UNSTABLE service (issue 14).
func TestCorrections(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		svc := func(id, action string) string { return e.pa() + "/services/" + id + action }
		t.Run("FailingResizeSupersededBySmaller", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "big", "cpu_millis": "1000"})
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "4000", "memory_gbs": "16"}})
			// In flight and not failing: another size waits its turn.
			e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "500", "memory_gbs": "2"}})
			e.failing(s.ServiceID)
			var got service
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "500", "memory_gbs": "2"}}).decode(t, &got)
			if got.Status != "CONFIGURING" || *got.Resources[0].Spec.CPUMillis != 500 {
				t.Errorf("the correcting resize answered %s %+v", got.Status, got.Resources)
			}
			if pending, superseded := e.operations(s.ServiceID); pending != 1 || superseded != 1 {
				t.Errorf("operations: %d pending, %d superseded; want the failing resize superseded by the new one", pending, superseded)
			}
		})
		t.Run("FailingResizeSupersededByDelete", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "gone"})
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "4000", "memory_gbs": "16"}})
			e.failing(s.ServiceID)
			e.want(202, "", req{Method: "DELETE", Path: svc(s.ServiceID, "")})
			if pending, superseded := e.operations(s.ServiceID); pending != 1 || superseded != 1 {
				t.Errorf("operations: %d pending, %d superseded", pending, superseded)
			}
		})
		t.Run("Unstable", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "u", "cpu_millis": "1000", "replica_count": 1})
			e.want(200, "", req{Method: "POST", Path: svc(s.ServiceID, "/enablePooler")})
			e.settle(s.ServiceID, dbcloud.StatusUnstable)
			// Growth waits for READY; corrections do not.
			e.want(409, "CONFLICT", req{Method: "POST", Path: svc(s.ServiceID, "/setHA"), Body: map[string]int{"replica_count": 2}})
			e.want(200, "", req{Method: "POST", Path: svc(s.ServiceID, "/disablePooler")})
			e.failing(s.ServiceID)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/setHA"), Body: map[string]int{"replica_count": 0}})
			e.failing(s.ServiceID)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "500", "memory_gbs": "2"}})
			e.failing(s.ServiceID)
			var got service
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/stop")}).decode(t, &got)
			if got.Status != "PAUSING" || got.HAReplicas.ReplicaCount != 0 || got.ConnectionPooler != nil || *got.Resources[0].Spec.CPUMillis != 500 {
				t.Errorf("after the corrections: %+v", got)
			}
			if pending, superseded := e.operations(s.ServiceID); pending != 1 || superseded != 3 {
				t.Errorf("operations: %d pending, %d superseded; want only the stop pending", pending, superseded)
			}
		})
	})
}

// TestBusyIsVisible: a pooler change shows CONFIGURING until it is made, so
// a 409 for a resize right after it is explained by what GET shows; and a
// repeat of a resize in flight is a 409, not a silent no-op (decisions.md
// section 6: "in effect" means settled).
func TestBusyIsVisible(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		svc := func(id, action string) string { return e.pa() + "/services/" + id + action }
		t.Run("PoolerThenResize", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "p"})
			e.want(200, "", req{Method: "POST", Path: svc(s.ServiceID, "/enablePooler")})
			if got := e.getService(s.ServiceID); got.Status != "CONFIGURING" {
				t.Errorf("status after enablePooler: %s, want CONFIGURING while the pooler is set up", got.Status)
			}
			e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}})
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}})
		})
		t.Run("ReplicaSetPoolerThenResize", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "rp"})
			var r struct{ ID string }
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/replicaSets"), Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}}).decode(t, &r)
			e.settle(r.ID, "")
			one := svc(s.ServiceID, "/replicaSets/"+r.ID)
			e.want(200, "", req{Method: "POST", Path: one + "/enablePooler"})
			var sets []struct{ ID, Status string }
			e.want(200, "", req{Method: "GET", Path: svc(s.ServiceID, "/replicaSets")}).decode(t, &sets)
			if len(sets) != 1 || sets[0].Status != "resizing" {
				t.Errorf("sets after enablePooler: %+v, want the set shown in progress", sets)
			}
			e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: one + "/resize", Body: map[string]any{"cpu_millis": "1000", "memory_gbs": "4"}})
			e.settle(r.ID, "")
			e.want(202, "", req{Method: "POST", Path: one + "/resize", Body: map[string]any{"cpu_millis": "1000", "memory_gbs": "4"}})
		})
		t.Run("TwoIdenticalResizes", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "twice"})
			var wg sync.WaitGroup
			codes := make([]int, 2)
			for i := range codes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					codes[i] = e.do(req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "2000", "memory_gbs": "8"}}).Status
				}()
			}
			wg.Wait()
			if !(codes[0] == 202 && codes[1] == 409 || codes[0] == 409 && codes[1] == 202) {
				t.Errorf("two identical resizes at once: %v, want one 202 and one 409", codes)
			}
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "2000", "memory_gbs": "8"}})
			if pending, _ := e.operations(s.ServiceID); pending != 0 {
				t.Errorf("a resize already in effect recorded an operation")
			}
		})
	})
}

// TestUpdatePassword_TenantTooSlow: a tenant database that does not take
// the password within the deadline fails only this request, with a 409,
// and the stored password is unchanged.
func TestUpdatePassword_TenantTooSlow(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	s := e.readyService(map[string]any{"name": "slow"})
	e.cloud.PasswordTimeout = 300 * time.Millisecond
	e.runtime.setPassword = func(ctx context.Context, _ *dbcloud.Service, _ string) error {
		<-ctx.Done() // never answers
		return ctx.Err()
	}
	before := verifierOf(t, e, s.ServiceID)
	res := e.want(409, "CONFLICT", req{Method: "POST", Path: e.pa() + "/services/" + s.ServiceID + "/updatePassword", Body: map[string]string{"password": "a-long-password"}})
	t.Logf("%s", res.Body)
	if verifierOf(t, e, s.ServiceID) != before {
		t.Error("the stored password changed although the service did not take it")
	}
	// The lease is released: the next attempt is judged afresh.
	e.runtime.setPassword = nil
	e.want(204, "", req{Method: "POST", Path: e.pa() + "/services/" + s.ServiceID + "/updatePassword", Body: map[string]string{"password": "a-long-password"}})
	if verifierOf(t, e, s.ServiceID) == before {
		t.Error("the stored password did not change after a successful update")
	}
}

// TestUpdatePassword_WaitsForBackgroundWork: a lease the engine holds for
// work nobody asked for (a snapshot, a repair) delays a password change
// instead of refusing it; one never given back is a 409 within the
// request's budget, and the password is unchanged.
func TestUpdatePassword_WaitsForBackgroundWork(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	s := e.readyService(map[string]any{"name": "busy"})
	e.cloud.PasswordTimeout = 2 * time.Second
	path := e.pa() + "/services/" + s.ServiceID + "/updatePassword"
	hold := func(owner string) {
		t.Helper()
		err := e.store.Update(context.Background(), func(tx dbcloud.Tx) error {
			ok, err := tx.AcquireLease(s.ServiceID, owner, time.Now(), time.Now().Add(time.Hour))
			if err == nil && !ok {
				err = fmt.Errorf("lease on %s is taken", s.ServiceID)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	release := func(owner string) {
		e.store.Update(context.Background(), func(tx dbcloud.Tx) error { return tx.ReleaseLease(s.ServiceID, owner) })
	}

	hold("snapshot")
	go func() {
		time.Sleep(300 * time.Millisecond) // the snapshot ends while the request waits
		release("snapshot")
	}()
	e.want(204, "", req{Method: "POST", Path: path, Body: map[string]string{"password": "after-the-snapshot"}})

	before := verifierOf(t, e, s.ServiceID)
	hold("stuck")
	defer release("stuck")
	res := e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: path, Body: map[string]string{"password": "never-applied-1"}})
	t.Logf("%s", res.Body)
	if verifierOf(t, e, s.ServiceID) != before {
		t.Error("the stored password changed although the lease was never free")
	}
}

func verifierOf(t *testing.T, e *env, id string) string {
	t.Helper()
	var v string
	e.store.View(context.Background(), func(tx dbcloud.Tx) error {
		s, err := tx.FindService(e.a.ProjectID, id)
		if err == nil {
			v = s.PasswordVerifier
		}
		return err
	})
	return v
}
