package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"dbcloud"
	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/internal/localtest"
	"dbcloud/runtime/local/postgres"
	"dbcloud/tlsca"
)

// TestPGUpgradeReason: what a user reads of a refused pg_upgrade names the
// check and pg_upgrade's explanation, and no host path.
func TestPGUpgradeReason(t *testing.T) {
	out := "Performing Consistency Checks\n-----------------------------\n" +
		"Checking cluster versions                                     ok\r\n" +
		"Checking database user is the install user                    ok\n" +
		"Checking data type usage                                      \n" +
		"Data type checks failed: Your installation contains one of the reg* data types in user tables.\n" +
		"These data types reference system OIDs that are not preserved by\npg_upgrade, so this cluster cannot currently be upgraded.\n" +
		"A list of the problem columns is in the file:\n    /srv/dbcloud/services/x/upgrade/new/pg_upgrade_output.d/t/tables_using_reg.txt\n\n" +
		"Failure, exiting\n"
	got := pgUpgradeReason(out)
	if !strings.HasPrefix(got, "Checking data type usage: Data type checks failed: Your installation contains one of the reg* data types") ||
		!strings.Contains(got, "cannot currently be upgraded.") || strings.Contains(got, "/srv") || strings.Contains(got, "Failure") {
		t.Errorf("reason %q", got)
	}
}

// TestRuntime_UpgradeKeepsWALSegmentSize: an upgrade's new cluster has
// the WAL segment size of the service's, as pg_upgrade requires: the
// 1 MiB of the clusters made now, and 16 MiB for a service made before.
func TestRuntime_UpgradeKeepsWALSegmentSize(t *testing.T) {
	rt := versionsRuntime(t)
	svc := newTestService(t, rt, "upseg", "upgrade-password-2", nil)
	svc.Spec.PGVersion = 15
	mustEnsure(t, rt, svc)
	svc.UpgradeTo = 17
	ctx := context.Background()
	u, err := rt.newUpgrade(ctx, svc, func(dbcloud.UpgradeStep) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.prepareWork(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(u.work) })
	old16 := filepath.Join(u.work, "old16")
	if _, err := u.run(ctx, u.fromBin, "initdb", "-D", old16, "-N", "-U", "postgres", "-A", "peer", "--wal-segsize=16"); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		from string
		want int
	}{{u.spec.PGData(), postgres.WALSegmentMB}, {old16, 16}} {
		if got, err := u.walSegmentMB(ctx, u.fromBin, c.from); err != nil || got != c.want {
			t.Errorf("%s: segments of %d MiB (%v), want %d", c.from, got, err, c.want)
		}
		dir := filepath.Join(u.work, "new"+strconv.Itoa(i))
		if err := u.initCluster(ctx, dir, c.from); err != nil {
			t.Fatal(err)
		}
		if got, err := u.walSegmentMB(ctx, u.toBin, dir); err != nil || got != c.want {
			t.Errorf("new cluster for %s: segments of %d MiB (%v), want %d", c.from, got, err, c.want)
		}
	}
}

// TestRuntime_UpgradeFailsAfterStop: when pg_upgrade refuses the
// service's own data after the service was stopped (here a reg* column,
// which a rehearsal would have caught first; it is skipped to reach this
// step), the old data is put back and served again on the old version,
// with the reason, and nothing of the attempt is left.
func TestRuntime_UpgradeFailsAfterStop(t *testing.T) {
	rt := versionsRuntime(t)
	const pw = "upgrade-password-1"
	svc := newTestService(t, rt, "upfail", pw, nil)
	svc.Spec.PGVersion = 15
	mustEnsure(t, rt, svc)
	mustExec(t, svc, pw, "CREATE TABLE t (v text); INSERT INTO t VALUES ('a'), ('b'); CREATE TABLE f (fn regproc)")

	svc.UpgradeTo = 17
	ctx := context.Background()
	var steps []string
	u, err := rt.newUpgrade(ctx, svc, func(s dbcloud.UpgradeStep) { steps = append(steps, s.Name) })
	if err != nil {
		t.Fatal(err)
	}
	err = u.upgradeService(ctx)
	if err == nil {
		t.Fatal("pg_upgrade of data with a reg* column succeeded")
	}
	var failed *dbcloud.UpgradeFailed
	if err := u.failed(ctx, "upgrade", err); !errors.As(err, &failed) || !strings.Contains(failed.Reason, "reg*") {
		t.Fatalf("failed upgrade: %v, want an UpgradeFailed naming reg*", err)
	}
	if !slices.Contains(steps, "stop") || !slices.Contains(steps, "rolled_back") {
		t.Errorf("steps %q: want the stop, then the roll back", steps)
	}
	if got := rows(t, svc, pw); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("rows after the failed upgrade: %q", got)
	}
	c, err := connectTLS(t, svc, pw)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var version string
	if err := c.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil || !strings.HasPrefix(version, "15.") {
		t.Errorf("server_version %q (%v) after the failed upgrade, want 15", version, err)
	}
	for _, left := range []string{u.newData(), u.oldData(), u.work, filepath.Join(rt.serviceDir(svc.ID), upgradeMarker)} {
		if _, err := os.Stat(left); err == nil {
			t.Errorf("%s left behind", left)
		}
	}
}

// versionsRuntime returns a Runtime with PostgreSQL 15 and 17, each with
// the guard, and no pool, closed at the end of the test; it skips the
// test on a host without them.
func versionsRuntime(t *testing.T) *Runtime {
	t.Helper()
	dirs := pgbin.Installed("/usr/lib/postgresql")
	if dirs[15] == "" || dirs[17] == "" {
		t.Skip("needs PostgreSQL 15 and 17 (scripts/postgresql.sh)")
	}
	for _, major := range []int{15, 17} {
		if _, err := os.Stat(filepath.Join(filepath.Dir(dirs[major]), "lib", postgres.GuardLibrary+".so")); err != nil {
			t.Skipf("no guard for %d: %v", major, err)
		}
	}
	base := localtest.Base(t)
	ca, err := tlsca.LoadOrCreateCA(filepath.Join(base, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := New(Config{BinDir: dirs[15], BinDirs: map[int]string{15: dirs[15], 17: dirs[17]}, DataDir: filepath.Join(base, "data"),
		Host: "127.0.0.1", CA: ca, Logger: localtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}
