package engine_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/cloud"
	"dbcloud/engine"
)

// upgradeRuntime is stubRuntime with a second version to upgrade to.
type upgradeRuntime struct{ stubRuntime }

func (upgradeRuntime) PGVersions() []dbcloud.PGVersion {
	return []dbcloud.PGVersion{{Major: 15, Full: "15.20"}, {Major: 17, Full: "17.12"}}
}

func (upgradeRuntime) UpgradeInPlace(context.Context, *dbcloud.Service, func(dbcloud.UpgradeStep)) (string, error) {
	panic("the domain never upgrades")
}

// upgrader is the test provisioner with the Upgrader capability: each
// call answers the next of results (a nil error succeeds).
type upgrader struct {
	*provisioner
	mu      sync.Mutex
	results []error
	calls   int
}

func (u *upgrader) UpgradeInPlace(_ context.Context, s *dbcloud.Service, step func(dbcloud.UpgradeStep)) (string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls++
	step(dbcloud.UpgradeStep{Name: "rehearsal_check", Detail: "checked"})
	if len(u.results) == 0 {
		return "17.12", nil
	}
	err := u.results[0]
	u.results = u.results[1:]
	if err != nil {
		return "", err
	}
	return "17.12", nil
}

// TestEngine_Upgrade: an accepted upgrade is made through the runtime's
// Upgrader before the ensure. A runtime error is retried; success moves
// the spec to the new version; an UpgradeFailed leaves the service READY
// on its old version with the reason, the operation failed.
func TestEngine_Upgrade(t *testing.T) {
	f := newFixture(t)
	f.cloud.Runtime = upgradeRuntime{}
	up := &upgrader{provisioner: f.prov}
	e := engine.New(f.store, up, "a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval, e.MetricsInterval = 20*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond
	e.LeaseTTL, e.MaxAttempts = 1500*time.Millisecond, 3
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	f.cloud.Notify = e.Notify
	t.Cleanup(func() { e.Close() })
	v15 := 15
	upgrade := func(name string) string {
		v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: name, PGVersion: &v15})
		if err != nil {
			t.Fatal(err)
		}
		f.waitStatus(t, v.Service.ID, dbcloud.StatusReady)
		v17 := 17
		if _, err := f.cloud.UpgradeService(f.ctx, f.pid, v.Service.ID, cloud.UpgradeRequest{PGVersion: &v17}); err != nil {
			t.Fatal(err)
		}
		return v.Service.ID
	}

	up.mu.Lock()
	up.results = []error{context.DeadlineExceeded, nil}
	up.mu.Unlock()
	id := upgrade("ok")
	got := f.waitFor(t, id, "READY on 17", func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.Status == dbcloud.StatusReady && v.Service.Spec.PGVersion == 17
	}).Service
	if got.PGVersionFull != "17.12" || got.UpgradeTo != 0 || got.StatusReason != "" || len(f.pending(t, id)) != 0 {
		t.Errorf("after the upgrade: %+v", got)
	}
	up.mu.Lock()
	if up.calls != 2 {
		t.Errorf("%d upgrade calls, want a retry after the runtime's error", up.calls)
	}
	up.results = []error{&dbcloud.UpgradeFailed{Step: "pg_upgrade --check", Reason: "reg* columns"}}
	up.mu.Unlock()

	id = upgrade("refused")
	got = f.waitFor(t, id, "READY with a reason", func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.Status == dbcloud.StatusReady && v.Service.StatusReason != ""
	}).Service
	if got.Spec.PGVersion != 15 || got.UpgradeTo != 0 || !strings.Contains(got.StatusReason, "reg* columns") || !strings.Contains(got.StatusReason, "PostgreSQL 15") {
		t.Errorf("after a failed upgrade: pg_version %d, upgrade_to %d, reason %q", got.Spec.PGVersion, got.UpgradeTo, got.StatusReason)
	}
	var op *dbcloud.Operation
	var steps int
	f.store.View(t.Context(), func(tx dbcloud.Tx) error {
		ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: id})
		for _, o := range ops {
			if o.Type == dbcloud.OpUpgradeService {
				op = o
			}
		}
		evs, _ := tx.ListEvents(f.pid, 0, 1000)
		for _, ev := range evs {
			if ev.Type == dbcloud.EventUpgradeStep && op != nil && ev.OperationID == op.ID {
				steps++
			}
		}
		return err
	})
	if op == nil || op.State != dbcloud.OpFailed || !strings.Contains(op.Error, "reg* columns") {
		t.Errorf("the failed upgrade's operation: %+v", op)
	}
	if steps == 0 {
		t.Error("no upgrade step among the events")
	}
}
