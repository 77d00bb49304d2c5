package http_test

import (
	"context"
	"strings"
	"testing"

	"dbcloud"
)

// noUpgrades is a runtime without the Upgrader capability, as the
// Kubernetes runtime is.
type noUpgrades struct{ dbcloud.Runtime }

// TestUpgrade_Refusals: upgradeService (decisions.md section 11) on both
// stores answers 202 with the service UPGRADING, and refuses a version
// that is not newer or unknown (400 listing versions), an addon without a
// build on the target (409 VERSION_UNAVAILABLE naming its extension), a
// second change while one is in flight or while a fork copies the service
// (409 OPERATION_IN_PROGRESS), the
// methods not offered yet (400) and a runtime that cannot upgrade (409).
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
		for _, m := range []string{"BLUE_GREEN", "ROLLBACK"} {
			res := e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path, Body: map[string]any{"pg_version": 17, "method": m}})
			if !strings.Contains(string(res.Body), "not offered yet") {
				t.Errorf("method %s: %s", m, res.Body)
			}
		}
		e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path, Body: map[string]any{"method": "IN_PLACE"}})

		ts := e.readyService(map[string]any{"name": "ts", "pg_version": 15, "addons": []string{"time-series"}})
		res := e.want(409, dbcloud.CodeVersionUnavailable, req{Method: "POST", Path: e.pa() + "/services/" + ts.ServiceID + "/upgrade",
			Body: map[string]any{"pg_version": 17}})
		if !strings.Contains(string(res.Body), "timescaledb") {
			t.Errorf("VERSION_UNAVAILABLE does not name the extension: %s", res.Body)
		}

		e.cloud.Runtime = noUpgrades{e.runtime}
		res = e.want(409, "CONFLICT", req{Method: "POST", Path: path, Body: map[string]any{"pg_version": 17}})
		if !strings.Contains(string(res.Body), "runtime does not upgrade services in place") {
			t.Errorf("a runtime without upgrades: %s", res.Body)
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
