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
	// The reason outlives the health loop's measurements: a user who looks
	// a minute later still reads why the upgrade failed.
	failedAt := time.Now()
	got = f.waitFor(t, id, "measured after the failed upgrade", func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.Metrics != nil && v.Service.Metrics.Measured.After(failedAt)
	}).Service
	if !strings.Contains(got.StatusReason, "reg* columns") {
		t.Errorf("after a measurement the failed upgrade's reason is %q", got.StatusReason)
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

// blueGreener is the test provisioner with the BlueGreenUpgrader
// capability (and a Maintainer, so the engine's backup round runs): it
// counts its calls.
type blueGreener struct {
	*provisioner
	mu                  sync.Mutex
	upgrades, rollbacks int
	removed             []string
}

// blueGreenRuntime is upgradeRuntime offering BLUE_GREEN and ROLLBACK.
type blueGreenRuntime struct{ upgradeRuntime }

func (blueGreenRuntime) UpgradeBlueGreen(context.Context, *dbcloud.Service, func(dbcloud.UpgradeStep)) (string, error) {
	panic("the domain never upgrades")
}

func (blueGreenRuntime) RollBackUpgrade(context.Context, *dbcloud.Service, func(dbcloud.UpgradeStep)) (string, error) {
	panic("the domain never rolls back")
}

func (blueGreenRuntime) RemoveKeptCluster(context.Context, *dbcloud.Service) error {
	panic("the domain never removes clusters")
}

func (b *blueGreener) UpgradeBlueGreen(_ context.Context, s *dbcloud.Service, step func(dbcloud.UpgradeStep)) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.upgrades++
	step(dbcloud.UpgradeStep{Name: "switch", Detail: "switched"})
	return "17.12", nil
}

func (b *blueGreener) RollBackUpgrade(_ context.Context, s *dbcloud.Service, step func(dbcloud.UpgradeStep)) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rollbacks++
	return "15.20", nil
}

func (b *blueGreener) RemoveKeptCluster(_ context.Context, s *dbcloud.Service) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.removed = append(b.removed, s.ID)
	return nil
}

func (b *blueGreener) MaintainBackups(context.Context, *dbcloud.Service) error { return nil }

// TestEngine_UpgradeBlueGreen: a BLUE_GREEN upgrade is made through the
// runtime's BlueGreenUpgrader and leaves the service on 17 with its old
// cluster kept for 24 hours; a ROLLBACK returns it to 15 and forgets the
// kept cluster; a kept cluster whose time is up is removed by the engine
// on its own, and the service no longer offers a rollback.
func TestEngine_UpgradeBlueGreen(t *testing.T) {
	f := newFixture(t)
	f.cloud.Runtime = blueGreenRuntime{}
	bg := &blueGreener{provisioner: f.prov}
	var clock sync.Mutex
	now := time.Now()
	e := engine.New(f.store, bg, "a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval, e.MetricsInterval, e.BackupInterval = 20*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond
	e.Now = func() time.Time { clock.Lock(); defer clock.Unlock(); return now }
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	f.cloud.Notify = e.Notify
	t.Cleanup(func() { e.Close() })
	v15, v17 := 15, 17
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "bg", PGVersion: &v15})
	if err != nil {
		t.Fatal(err)
	}
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusReady)
	if _, err := f.cloud.UpgradeService(f.ctx, f.pid, id, cloud.UpgradeRequest{PGVersion: &v17, Method: dbcloud.UpgradeBlueGreen}); err != nil {
		t.Fatal(err)
	}
	got := f.waitFor(t, id, "READY on 17", func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.Status == dbcloud.StatusReady && v.Service.Spec.PGVersion == 17
	}).Service
	if k := got.KeptCluster; k == nil || k.PGVersion != 15 || !k.Until.Equal(now.UTC().Add(dbcloud.KeepOldClusterFor)) || got.UpgradeMethod != "" {
		t.Fatalf("after BLUE_GREEN: kept %+v, method %q", got.KeptCluster, got.UpgradeMethod)
	}
	if _, err := f.cloud.UpgradeService(f.ctx, f.pid, id, cloud.UpgradeRequest{PGVersion: &v15, Method: dbcloud.UpgradeRollback}); err != nil {
		t.Fatal(err)
	}
	got = f.waitFor(t, id, "READY on 15", func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.Status == dbcloud.StatusReady && v.Service.Spec.PGVersion == 15
	}).Service
	if got.KeptCluster != nil || got.PGVersionFull != "15.20" {
		t.Fatalf("after ROLLBACK: kept %+v, full %q", got.KeptCluster, got.PGVersionFull)
	}

	// Upgrade again, then let the day pass.
	if _, err := f.cloud.UpgradeService(f.ctx, f.pid, id, cloud.UpgradeRequest{PGVersion: &v17, Method: dbcloud.UpgradeBlueGreen}); err != nil {
		t.Fatal(err)
	}
	f.waitFor(t, id, "READY on 17 again", func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.Status == dbcloud.StatusReady && v.Service.KeptCluster != nil
	})
	clock.Lock()
	now = now.Add(dbcloud.KeepOldClusterFor + time.Minute)
	clock.Unlock()
	f.waitFor(t, id, "the kept cluster removed", func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.KeptCluster == nil
	})
	bg.mu.Lock()
	defer bg.mu.Unlock()
	if bg.upgrades != 2 || bg.rollbacks != 1 || len(bg.removed) != 1 || bg.removed[0] != id {
		t.Errorf("runtime calls: %d upgrades, %d rollbacks, removed %v", bg.upgrades, bg.rollbacks, bg.removed)
	}
}
