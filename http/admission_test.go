package http_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"dbcloud"
)

// TestAdmission refuses every operation that adds or grows instances beyond
// the host or the project's resource quota, with 409 and what is free, and
// changes nothing. The host has 4000 millicores and 16 GiB (no
// overcommit); the project starts with b (2000/8) and c (shared: 500
// millicores, 0.5 GiB), so 1500 millicores and 7.5 GiB are free.
func TestAdmission(t *testing.T) {
	type ids struct{ b, c, set string }
	cases := []struct {
		name string
		// setup runs after b and c are READY.
		setup func(e *env, id *ids)
		quota *dbcloud.ResourceQuota
		call  func(e *env, id ids) req
		code  string
	}{
		{name: "CreateOverTotal", call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "x", "cpu_millis": "4000"}}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "CreateLargerThanHost", call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "x", "cpu_millis": "8000"}}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "CreateWithHAReplicas", call: func(e *env, id ids) req {
			// 1000/4 fits once, not three times (primary and 2 standbys).
			return req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "x", "cpu_millis": "1000", "replica_count": 2}}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "Fork", call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.b + "/forkService", Body: map[string]any{"fork_strategy": "LAST_SNAPSHOT"}}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "Resize", call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.b + "/resize", Body: map[string]string{"cpu_millis": "4000", "memory_gbs": "16"}}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "SetHA", call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.b + "/setHA", Body: map[string]int{"replica_count": 1}}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "ReplicaSetCreate", call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.c + "/replicaSets", Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 4}}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "ReplicaSetResizeNodes", setup: func(e *env, id *ids) {
			var r struct{ ID string }
			e.want(202, "", req{Method: "POST", Path: e.pa() + "/services/" + id.c + "/replicaSets", Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}}).decode(e.t, &r)
			e.settle(r.ID, "")
			id.set = r.ID
		}, call: func(e *env, id ids) req {
			// 1000 millicores are free: two more nodes of 500 fit, three do not.
			return req{Method: "POST", Path: e.pa() + "/services/" + id.c + "/replicaSets/" + id.set + "/resize", Body: map[string]any{"cpu_millis": "500", "memory_gbs": "2", "nodes": 4}}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "ReplicaSetResizeSize", setup: func(e *env, id *ids) {
			var r struct{ ID string }
			e.want(202, "", req{Method: "POST", Path: e.pa() + "/services/" + id.c + "/replicaSets", Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}}).decode(e.t, &r)
			e.settle(r.ID, "")
			id.set = r.ID
		}, call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.c + "/replicaSets/" + id.set + "/resize", Body: map[string]any{"cpu_millis": "2000", "memory_gbs": "8"}}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "StartPaused", setup: func(e *env, id *ids) {
			e.want(202, "", req{Method: "POST", Path: e.pa() + "/services/" + id.b + "/stop"})
			e.settle(id.b, dbcloud.StatusPaused)
			// b's room is taken meanwhile.
			s := e.createService(map[string]any{"name": "d", "cpu_millis": "2000"})
			e.settle(s.ServiceID, dbcloud.StatusReady)
		}, call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.b + "/start"}
		}, code: dbcloud.CodeCapacityExceeded},
		{name: "QuotaInstances", quota: &dbcloud.ResourceQuota{Instances: 2}, call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.c + "/setHA", Body: map[string]int{"replica_count": 1}}
		}, code: dbcloud.CodeQuotaExceeded},
		{name: "QuotaInstancesReplicaNodes", quota: &dbcloud.ResourceQuota{Instances: 3}, call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.c + "/replicaSets", Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 2}}
		}, code: dbcloud.CodeQuotaExceeded},
		// b reserves 2000 millicores; the shared c none (issue 38).
		{name: "QuotaMillicores", quota: &dbcloud.ResourceQuota{CPUMillis: 2500}, call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "x", "cpu_millis": "1000"}}
		}, code: dbcloud.CodeQuotaExceeded},
		{name: "QuotaStorageFork", quota: &dbcloud.ResourceQuota{StorageGBs: 5}, setup: func(e *env, id *ids) {
			// b holds 3 GiB of data (measured): a fork copies it.
			err := e.store.Update(context.Background(), func(tx dbcloud.Tx) error {
				s, err := tx.FindService(e.a.ProjectID, id.b)
				if err != nil {
					return err
				}
				s.Metrics = &dbcloud.Metrics{StorageMB: 3 << 10}
				return tx.UpdateService(s)
			})
			if err != nil {
				e.t.Fatal(err)
			}
		}, call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.b + "/forkService", Body: map[string]any{"fork_strategy": "LAST_SNAPSHOT", "cpu_millis": "shared"}}
		}, code: dbcloud.CodeQuotaExceeded},
		{name: "QuotaMemory", quota: &dbcloud.ResourceQuota{MemoryGBs: 9}, call: func(e *env, id ids) req {
			return req{Method: "POST", Path: e.pa() + "/services/" + id.c + "/resize", Body: map[string]string{"cpu_millis": "500", "memory_gbs": "2"}}
		}, code: dbcloud.CodeQuotaExceeded},
	}
	forEachStore(t, func(t *testing.T, kind string) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t, kind, noLimits)
				e.runtime.host = &dbcloud.HostCapacity{CPUMillis: 4000, MemoryBytes: 16 << 30, Overcommit: 1, DiskFreeBytes: 100 << 30}
				id := ids{
					b: e.readyService(map[string]any{"name": "b", "cpu_millis": "2000"}).ServiceID,
					c: e.readyService(map[string]any{"name": "c", "cpu_millis": "shared"}).ServiceID,
				}
				if tc.setup != nil {
					tc.setup(e, &id)
				}
				if tc.quota != nil {
					if _, err := e.cloud.SetProjectQuota(context.Background(), e.a.ProjectID, tc.quota); err != nil {
						t.Fatal(err)
					}
				}
				before := e.do(req{Method: "GET", Path: e.pa() + "/services"}).Body
				r := tc.call(e, id)
				res := e.want(409, tc.code, r)
				var body struct{ Message string }
				res.decode(t, &body)
				if !strings.Contains(body.Message, "free") {
					t.Errorf("the refusal does not say what is free: %q", body.Message)
				}
				t.Logf("%s %s: %s", r.Method, r.Path, body.Message)
				if after := e.do(req{Method: "GET", Path: e.pa() + "/services"}).Body; !bytes.Equal(before, after) {
					t.Errorf("the refused request changed the services:\nbefore %s\nafter  %s", before, after)
				}
				if got := e.getService(id.c); got.Status != "READY" {
					t.Errorf("c is %s after a refusal, want READY", got.Status)
				}
				ops := 0
				e.store.View(context.Background(), func(tx dbcloud.Tx) error {
					for _, rid := range []string{id.b, id.c, id.set} {
						p, _ := tx.ListOperations(dbcloud.OperationFilter{ResourceID: rid, Pending: true})
						ops += len(p)
					}
					return nil
				})
				if ops != 0 {
					t.Errorf("the refusal left %d pending operations", ops)
				}
			})
		}
	})
}

// TestAdmission_ShrinkAlwaysPasses: a project over its quota (lowered after
// the fact) or a host over its capacity can still shrink and remove.
func TestAdmission_ShrinkAlwaysPasses(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		s := e.readyService(map[string]any{"name": "b", "cpu_millis": "2000", "replica_count": 2})
		e.runtime.host = &dbcloud.HostCapacity{CPUMillis: 1000, MemoryBytes: 4 << 30, Overcommit: 1, DiskFreeBytes: 100 << 30}
		if _, err := e.cloud.SetProjectQuota(context.Background(), e.a.ProjectID, &dbcloud.ResourceQuota{Instances: 1, CPUMillis: 500}); err != nil {
			t.Fatal(err)
		}
		path := e.pa() + "/services/" + s.ServiceID
		e.want(202, "", req{Method: "POST", Path: path + "/setHA", Body: map[string]int{"replica_count": 1}})
		e.settle(s.ServiceID, dbcloud.StatusReady)
		e.want(202, "", req{Method: "POST", Path: path + "/resize", Body: map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}})
		e.settle(s.ServiceID, dbcloud.StatusReady)
		e.want(409, dbcloud.CodeCapacityExceeded, req{Method: "POST", Path: path + "/setHA", Body: map[string]int{"replica_count": 2}})
		e.want(202, "", req{Method: "POST", Path: path + "/stop"})
		e.settle(s.ServiceID, dbcloud.StatusPaused)
		// Starting is growth again: the host, then the quota, refuse it.
		e.want(409, dbcloud.CodeCapacityExceeded, req{Method: "POST", Path: path + "/start"})
		e.runtime.mu.Lock()
		e.runtime.host = nil
		e.runtime.mu.Unlock()
		e.want(409, dbcloud.CodeQuotaExceeded, req{Method: "POST", Path: path + "/start"})
		e.want(202, "", req{Method: "DELETE", Path: path})
	})
}

// TestAdmission_DiskFullIs503: with the host's disk too full for a new
// instance, a create is refused with 503 and Retry-After (nothing made),
// a change that needs no new instance still passes, and the create passes
// once space is back.
func TestAdmission_DiskFullIs503(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	s := e.readyService(map[string]any{"name": "a"})
	e.runtime.mu.Lock()
	e.runtime.host = &dbcloud.HostCapacity{CPUMillis: 4000, MemoryBytes: 16 << 30, Overcommit: 1, DiskFreeBytes: 100 << 20}
	e.runtime.mu.Unlock()
	res := e.want(503, "UNAVAILABLE", req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "b"}})
	if got := res.Header.Get("Retry-After"); got != "60" {
		t.Errorf("Retry-After = %q, want 60", got)
	}
	var body struct{ Message string }
	res.decode(t, &body)
	if !strings.Contains(body.Message, "disk") {
		t.Errorf("message %q does not say the disk is full", body.Message)
	}
	path := e.pa() + "/services/" + s.ServiceID
	e.want(202, "", req{Method: "POST", Path: path + "/resize", Body: map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}})
	e.settle(s.ServiceID, dbcloud.StatusReady)
	var list []map[string]any
	e.want(200, "", req{Method: "GET", Path: e.pa() + "/services"}).decode(t, &list)
	if len(list) != 1 {
		t.Fatalf("services after a refused create: %d, want 1", len(list))
	}
	e.runtime.mu.Lock()
	e.runtime.host.DiskFreeBytes = 100 << 30
	e.runtime.mu.Unlock()
	e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "b"}})
}

// TestAdmission_SharedSlice: shared services are admitted by their
// footprint against the memory the host has left, not by a CPU sum: a
// 2-core host with 4 GiB takes more than the 16 that half a core each
// overcommitted 4 times allowed; a dedicated size is still admitted with
// the shared ones running (they never starve it); the shared count is then
// bounded by what the dedicated service and the system reserve leave, and
// a host whose memory is in use takes no shared service at all. Each
// refusal says what is full and changes nothing.
func TestAdmission_SharedSlice(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	if _, err := e.cloud.SetProjectQuota(context.Background(), e.a.ProjectID, &dbcloud.ResourceQuota{}); err != nil {
		t.Fatal(err)
	}
	host := dbcloud.HostCapacity{CPUMillis: 2000, MemoryBytes: 4 << 30, Overcommit: 4, DiskFreeBytes: 1 << 40}
	setHost := func(h dbcloud.HostCapacity) {
		e.runtime.mu.Lock()
		e.runtime.host = &h
		e.runtime.mu.Unlock()
	}
	setHost(host)
	shared := func(i int) req {
		return req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": fmt.Sprintf("s%d", i), "cpu_millis": "shared"}}
	}
	for i := range 20 {
		var s struct {
			ServiceID string `json:"service_id"`
		}
		e.want(202, "", shared(i)).decode(t, &s)
		e.settle(s.ServiceID, dbcloud.StatusReady)
	}
	// A dedicated 500/2 beside 20 running shared services.
	d := e.readyService(map[string]any{"name": "dedicated", "cpu_millis": "500"})
	// Now 4 GiB less 2 GiB reserved by it and 1 GiB for the system leaves
	// room for 16 shared services; 20 run: the next is refused.
	res := e.want(409, dbcloud.CodeCapacityExceeded, shared(20))
	if !strings.Contains(string(res.Body), "holds at most 16") {
		t.Errorf("refusal: %s", res.Body)
	}
	// A service being deleted counts as gone.
	e.want(202, "", req{Method: "DELETE", Path: e.pa() + "/services/" + d.ServiceID})
	var s struct {
		ServiceID string `json:"service_id"`
	}
	e.want(202, "", shared(21)).decode(t, &s)
	e.settle(s.ServiceID, dbcloud.StatusReady)
	// Memory in use by others: no shared service, whatever the count.
	host.MemAvailableBytes = 1 << 30
	setHost(host)
	res = e.want(409, dbcloud.CodeCapacityExceeded, shared(22))
	if !strings.Contains(string(res.Body), "memory is in use") {
		t.Errorf("refusal with the memory in use: %s", res.Body)
	}
	var list []struct{}
	e.want(200, "", req{Method: "GET", Path: e.pa() + "/services"}).decode(t, &list)
	if len(list) != 22 {
		t.Errorf("%d services after the refusals, want 22 (21 shared and the one being deleted)", len(list))
	}
}
