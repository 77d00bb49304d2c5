package http_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"dbcloud"
)

// noUpgrades is a runtime without the Upgrader capability, as the
// Kubernetes runtime is.
type noUpgrades struct{ dbcloud.Runtime }

// timescale17 is the test runtime with TimescaleDB built for 17 too, so
// that what refuses an upgrade of a service using it is the method.
type timescale17 struct{ *testRuntime }

func (timescale17) PGVersions() []dbcloud.PGVersion {
	ext := map[string]bool{"vector": true, "timescaledb": true}
	return []dbcloud.PGVersion{{Major: 15, Full: "15.20", Extensions: ext}, {Major: 17, Full: "17.12", Extensions: ext}}
}

// TestUpgrade_Refusals: upgradeService (decisions.md section 11) on both
// stores answers 202 with the service UPGRADING, and refuses a version
// that is not newer or unknown (400 listing versions), an addon without a
// build on the target (409 VERSION_UNAVAILABLE naming its extension), a
// second change while one is in flight or while a fork copies the service
// (409 OPERATION_IN_PROGRESS), an unknown method (400) and a runtime
// that cannot upgrade (409).
func TestUpgrade_Refusals(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		svc := e.readyService(map[string]any{"name": "old", "pg_version": 15})
		path := e.pa() + "/services/" + svc.ServiceID + "/upgrade"
		for _, tc := range []struct {
			body  map[string]any
			lists string
		}{
			{map[string]any{"pg_version": 15}, "17"},
			{map[string]any{"pg_version": 14}, "15, 17"},
			{map[string]any{"pg_version": 16, "method": "IN_PLACE"}, "15, 17"},
		} {
			res := e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path, Body: tc.body})
			if !strings.Contains(string(res.Body), tc.lists) {
				t.Errorf("upgrade to %v: the 400 does not list %s: %s", tc.body["pg_version"], tc.lists, res.Body)
			}
		}
		res := e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path, Body: map[string]any{"pg_version": 17, "method": "SIDEWAYS"}})
		if !strings.Contains(string(res.Body), "BLUE_GREEN") {
			t.Errorf("an unknown method: %s", res.Body)
		}
		e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path, Body: map[string]any{"method": "IN_PLACE"}})

		ts := e.readyService(map[string]any{"name": "ts", "pg_version": 15, "addons": []string{"time-series"}})
		res = e.want(409, dbcloud.CodeVersionUnavailable, req{Method: "POST", Path: e.pa() + "/services/" + ts.ServiceID + "/upgrade",
			Body: map[string]any{"pg_version": 17}})
		if !strings.Contains(string(res.Body), "timescaledb") {
			t.Errorf("VERSION_UNAVAILABLE does not name the extension: %s", res.Body)
		}

		e.cloud.Runtime = noUpgrades{e.runtime}
		res = e.want(409, "CONFLICT", req{Method: "POST", Path: path, Body: map[string]any{"pg_version": 17}})
		if !strings.Contains(string(res.Body), "runtime does not upgrade services in place") {
			t.Errorf("a runtime without upgrades: %s", res.Body)
		}
		for _, m := range []string{"BLUE_GREEN", "ROLLBACK"} {
			res = e.want(409, "CONFLICT", req{Method: "POST", Path: path, Body: map[string]any{"pg_version": 17, "method": m}})
			if !strings.Contains(string(res.Body), "does not offer "+m) {
				t.Errorf("%s on a runtime without it: %s", m, res.Body)
			}
		}
		e.cloud.Runtime = e.runtime

		var fork service
		e.want(202, "", req{Method: "POST", Path: e.pa() + "/services/" + svc.ServiceID + "/forkService",
			Body: map[string]any{"fork_strategy": "LAST_SNAPSHOT"}}).decode(t, &fork)
		res = e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: path, Body: map[string]any{"pg_version": 17}})
		if !strings.Contains(string(res.Body), fork.ServiceID) {
			t.Errorf("an upgrade while a fork copies: %s", res.Body)
		}
		e.settle(fork.ServiceID, dbcloud.StatusReady)

		var up service
		e.want(202, "", req{Method: "POST", Path: path, Body: map[string]any{"pg_version": 17}}).decode(t, &up)
		if up.Status != "UPGRADING" || up.Metadata.PGVersion != 15 {
			t.Errorf("accepted upgrade: status %s, pg_version %d; want UPGRADING on 15 until it is done", up.Status, up.Metadata.PGVersion)
		}
		e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: path, Body: map[string]any{"pg_version": 17}})
		// Not even as a correction of an upgrade that keeps failing.
		err := e.cloud.Store.Update(context.Background(), func(tx dbcloud.Tx) error {
			ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: svc.ServiceID, Pending: true})
			for _, op := range ops {
				op.Attempts = 2
				if err == nil {
					err = tx.UpdateOperation(op)
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, change := range []string{"resize", "stop"} {
			e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: e.pa() + "/services/" + svc.ServiceID + "/" + change,
				Body: map[string]any{"cpu_millis": "500", "memory_gbs": "2"}})
		}
	})
}

// TestUpgrade_BlueGreenRefusals: BLUE_GREEN is refused (409) for what
// logical replication cannot move, naming it and pointing to IN_PLACE:
// TimescaleDB, HA replicas, read replica sets. ROLLBACK is refused
// without a kept old cluster (409), once it expired (409 saying when),
// and to another version than the kept one's (400); within the time it
// is accepted with a status_reason saying what is lost.
func TestUpgrade_BlueGreenRefusals(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		e.cloud.Runtime = timescale17{e.runtime}
		bg := map[string]any{"pg_version": 17, "method": "BLUE_GREEN"}
		upgrade := func(id string) string { return e.pa() + "/services/" + id + "/upgrade" }
		for _, tc := range []struct {
			body map[string]any
			says string
		}{
			{map[string]any{"name": "ts", "pg_version": 15, "addons": []string{"time-series"}}, "timescaledb"},
			{map[string]any{"name": "ha", "pg_version": 15, "replica_count": 1}, "HA replicas"},
		} {
			svc := e.readyService(tc.body)
			res := e.want(409, "CONFLICT", req{Method: "POST", Path: upgrade(svc.ServiceID), Body: bg})
			if !strings.Contains(string(res.Body), tc.says) || !strings.Contains(string(res.Body), "IN_PLACE") {
				t.Errorf("BLUE_GREEN of %s: %s", tc.body["name"], res.Body)
			}
		}
		withSet := e.readyService(map[string]any{"name": "rs", "pg_version": 15})
		e.want(202, "", req{Method: "POST", Path: e.pa() + "/services/" + withSet.ServiceID + "/replicaSets",
			Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}})
		res := e.want(409, "CONFLICT", req{Method: "POST", Path: upgrade(withSet.ServiceID), Body: bg})
		if !strings.Contains(string(res.Body), "read replica sets") {
			t.Errorf("BLUE_GREEN with a read replica set: %s", res.Body)
		}

		svc := e.readyService(map[string]any{"name": "switched", "pg_version": 15})
		rollback := map[string]any{"pg_version": 15, "method": "ROLLBACK"}
		res = e.want(409, "CONFLICT", req{Method: "POST", Path: upgrade(svc.ServiceID), Body: rollback})
		if !strings.Contains(string(res.Body), "no old cluster") {
			t.Errorf("ROLLBACK without a kept cluster: %s", res.Body)
		}
		keep := func(until time.Time) {
			err := e.cloud.Store.Update(context.Background(), func(tx dbcloud.Tx) error {
				s, err := tx.FindService(e.a.ProjectID, svc.ServiceID)
				if err != nil {
					return err
				}
				s.Spec.PGVersion = 17
				s.KeptCluster = &dbcloud.KeptCluster{PGVersion: 15, PGVersionFull: "15.20", Until: until}
				return tx.UpdateService(s)
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		keep(time.Now().Add(-time.Minute))
		res = e.want(409, "CONFLICT", req{Method: "POST", Path: upgrade(svc.ServiceID), Body: rollback})
		if !strings.Contains(string(res.Body), "no longer possible") {
			t.Errorf("ROLLBACK after the kept cluster expired: %s", res.Body)
		}
		keep(time.Now().Add(time.Hour))
		e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: upgrade(svc.ServiceID), Body: map[string]any{"pg_version": 17, "method": "ROLLBACK"}})
		var rolling struct {
			Status       string `json:"status"`
			StatusReason string `json:"status_reason"`
		}
		e.want(202, "", req{Method: "POST", Path: upgrade(svc.ServiceID), Body: rollback}).decode(t, &rolling)
		if rolling.Status != "UPGRADING" || !strings.Contains(rolling.StatusReason, "lost") {
			t.Errorf("accepted ROLLBACK: status %s, reason %q", rolling.Status, rolling.StatusReason)
		}
	})
}
