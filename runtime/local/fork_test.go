package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/backup"
	"dbcloud/runtime/local/internal/localtest"
	"dbcloud/tlsca"
)

// mustRuntime returns a Runtime over base/data with no pool, closed at the
// end of the test.
func mustRuntime(tb testing.TB, base string) *Runtime {
	tb.Helper()
	ca, err := tlsca.LoadOrCreateCA(filepath.Join(base, "ca"))
	if err != nil {
		tb.Fatal(err)
	}
	logger := localtest.Logger(tb)
	rt, err := New(Config{BinDir: pgbin.Dir(), DataDir: filepath.Join(base, "data"), Host: "127.0.0.1", CA: ca, Logger: logger})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { rt.Close() })
	return rt
}

// newTestService returns a shared-size service with a free port; its
// files and processes go when the test ends.
func newTestService(tb testing.TB, rt *Runtime, id, password string, fork *dbcloud.ForkSource) *dbcloud.Service {
	tb.Helper()
	// Instance cgroups are named by service ID host-wide: test processes
	// running side by side (two checkouts) must not share one.
	id = fmt.Sprintf("%s-%d", id, os.Getpid())
	svc := &dbcloud.Service{
		ID: id, ProjectID: "p", Name: id, Fork: fork,
		Spec:             dbcloud.ServiceSpec{Size: dbcloud.Size{Shared: true}, Running: true},
		Endpoint:         &dbcloud.Endpoint{Host: "127.0.0.1", Port: localtest.FreePort(tb)},
		PasswordVerifier: dbcloud.NewSCRAMVerifier(password),
	}
	tb.Cleanup(func() {
		if err := rt.DeleteService(context.Background(), svc); err != nil {
			tb.Errorf("delete %s: %v", id, err)
		}
	})
	return svc
}

func mustEnsure(tb testing.TB, rt *Runtime, svc *dbcloud.Service) {
	tb.Helper()
	obs, err := rt.EnsureService(context.Background(), svc)
	if err != nil {
		tb.Fatalf("ensure %s: %v", svc.ID, err)
	}
	if obs.Running != svc.Spec.Running {
		tb.Fatalf("ensure %s: running %v, want %v", svc.ID, obs.Running, svc.Spec.Running)
	}
}

// tcpDSN reaches tsdb as tsdbadmin over TCP on the loopback port.
func tcpDSN(port int, password, sslmode string) string {
	return fmt.Sprintf("postgres://tsdbadmin:%s@127.0.0.1:%d/tsdb?sslmode=%s&connect_timeout=5", password, port, sslmode)
}

// connectTLS logs in as tsdbadmin over TLS, as a client does.
func connectTLS(tb testing.TB, svc *dbcloud.Service, password string) (*pgx.Conn, error) {
	tb.Helper()
	return pgx.Connect(context.Background(), tcpDSN(svc.Endpoint.Port, password, "require"))
}

func mustExec(tb testing.TB, svc *dbcloud.Service, password, sql string) {
	tb.Helper()
	c, err := connectTLS(tb, svc, password)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(context.Background(), sql); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// rows returns the values of table t, sorted.
func rows(tb testing.TB, svc *dbcloud.Service, password string) []string {
	tb.Helper()
	c, err := connectTLS(tb, svc, password)
	if err != nil {
		tb.Fatalf("connect to %s: %v", svc.ID, err)
	}
	defer c.Close(context.Background())
	r, err := c.Query(context.Background(), "SELECT v FROM t ORDER BY v")
	if err != nil {
		tb.Fatal(err)
	}
	out, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// TestRuntime_Forks drives snapshots, the archive and every fork strategy
// on real PostgreSQL; the steps share one parent because each costs a
// cluster.
func TestRuntime_Forks(t *testing.T) {
	ctx := context.Background()
	base := localtest.Base(t)
	rt := mustRuntime(t, base)
	parent := newTestService(t, rt, "parent0001", "parent-password", nil)
	mustEnsure(t, rt, parent)
	mustExec(t, parent, "parent-password", "CREATE TABLE t (v text); INSERT INTO t VALUES ('1 before snapshot')")

	if w, err := rt.RecoveryWindow(ctx, parent); err != nil || !w.LastSnapshot.IsZero() {
		t.Fatalf("window before any snapshot: %+v, %v", w, err)
	}
	if err := rt.MaintainBackups(ctx, parent); err != nil {
		t.Fatal(err)
	}
	snaps, err := rt.backups.Snapshots(rt.serviceDir(parent.ID))
	if err != nil || len(snaps) != 1 || !snaps[0].Archived {
		t.Fatalf("snapshots after the first MaintainBackups: %+v, %v", snaps, err)
	}
	if err := rt.MaintainBackups(ctx, parent); err != nil {
		t.Fatal(err)
	}
	if again, _ := rt.backups.Snapshots(rt.serviceDir(parent.ID)); len(again) != 1 {
		t.Fatalf("a second snapshot within the interval: %d", len(again))
	}
	mustExec(t, parent, "parent-password", "INSERT INTO t VALUES ('2 after snapshot')")
	time.Sleep(20 * time.Millisecond)
	target := time.Now()
	time.Sleep(20 * time.Millisecond)
	mustExec(t, parent, "parent-password", "INSERT INTO t VALUES ('3 after target')")

	// A running parent is restorable up to now: the window ends at the
	// moment of the call.
	before := time.Now()
	w, err := rt.RecoveryWindow(ctx, parent)
	if err != nil || w.From != snaps[0].Finished || w.Stopped || w.To.Before(before) || w.To.After(time.Now()) {
		t.Fatalf("window of the running parent: %+v, %v; want from %v to a moment during the call", w, err, snaps[0].Finished)
	}

	forks := map[dbcloud.ForkStrategy][]string{
		dbcloud.ForkLastSnapshot: {"1 before snapshot"},
		dbcloud.ForkNow:          {"1 before snapshot", "2 after snapshot", "3 after target"},
		dbcloud.ForkPITR:         {"1 before snapshot", "2 after snapshot"},
	}
	var now *dbcloud.Service
	top := t // forks live until the end, beyond their subtests
	for i, strategy := range []dbcloud.ForkStrategy{dbcloud.ForkLastSnapshot, dbcloud.ForkNow, dbcloud.ForkPITR} {
		t.Run(string(strategy), func(t *testing.T) {
			src := &dbcloud.ForkSource{ServiceID: parent.ID, Strategy: strategy}
			if strategy == dbcloud.ForkPITR {
				src.TargetTime = &target
			}
			fork := newTestService(top, rt, "fork00000"+string(rune('a'+i)), "fork-password", src)
			begin := time.Now()
			mustEnsure(t, rt, fork)
			t.Logf("%s fork ready in %v", strategy, time.Since(begin))
			if got := rows(t, fork, "fork-password"); !slices.Equal(got, forks[strategy]) {
				t.Errorf("rows = %q, want %q", got, forks[strategy])
			}
			if c, err := connectTLS(t, fork, "parent-password"); err == nil {
				c.Close(ctx)
				t.Error("the parent's password works on the fork")
			}
			conf, err := os.ReadFile(filepath.Join(rt.serviceDir(fork.ID), "0", "conf", "postgresql.conf"))
			if err != nil || strings.Contains(string(conf), "recovery") || strings.Contains(string(conf), "restore_command") ||
				!strings.Contains(string(conf), rt.archiveDir(fork.ID)) {
				t.Errorf("fork config: recovery settings linger or the archive is not its own (%v):\n%s", err, conf)
			}
			if _, err := os.Stat(filepath.Join(rt.serviceDir(fork.ID), "0", "pgdata", "recovery.signal")); err == nil {
				t.Error("recovery.signal remains")
			}
			if h, _ := backup.Holds(rt.serviceDir(parent.ID)); len(h) != 0 {
				t.Errorf("holds on the parent after the restore: %v", h)
			}
			// EnsureService again does not restore again.
			mustExec(t, fork, "fork-password", "INSERT INTO t VALUES ('4 in fork')")
			mustEnsure(t, rt, fork)
			if got := rows(t, fork, "fork-password"); len(got) != len(forks[strategy])+1 {
				t.Errorf("after a second ensure: %q", got)
			}
			if strategy == dbcloud.ForkNow {
				now = fork
			}
		})
	}
	if got := rows(t, parent, "parent-password"); len(got) != 3 {
		t.Errorf("the parent changed: %q", got)
	}

	t.Run("PausedParent", func(t *testing.T) {
		parent.Spec.Running = false
		mustEnsure(t, rt, parent)
		w, err := rt.RecoveryWindow(ctx, parent)
		if err != nil || !w.Stopped || w.From != snaps[0].Finished || !w.To.After(target) || w.To.After(time.Now()) {
			t.Fatalf("window of the stopped parent: %+v, %v", w, err)
		}
		for i, c := range []struct {
			target time.Time
			want   []string
		}{
			{target, []string{"1 before snapshot", "2 after snapshot"}},                 // a commit follows: by time
			{w.To, []string{"1 before snapshot", "2 after snapshot", "3 after target"}}, // the last commit: by LSN
			{snaps[0].Finished, []string{"1 before snapshot"}},                          // the snapshot itself
		} {
			fork := newTestService(t, rt, "pitrpause"+string(rune('a'+i)), "fork-password",
				&dbcloud.ForkSource{ServiceID: parent.ID, Strategy: dbcloud.ForkPITR, TargetTime: &c.target})
			mustEnsure(t, rt, fork)
			if got := rows(t, fork, "fork-password"); !slices.Equal(got, c.want) {
				t.Errorf("PITR to %v of the stopped parent: rows %q, want %q", c.target, got, c.want)
			}
		}
		fork := newTestService(t, rt, "lastpausea", "fork-password",
			&dbcloud.ForkSource{ServiceID: parent.ID, Strategy: dbcloud.ForkLastSnapshot})
		mustEnsure(t, rt, fork)
		if got := rows(t, fork, "fork-password"); !slices.Equal(got, []string{"1 before snapshot"}) {
			t.Errorf("LAST_SNAPSHOT of the stopped parent: %q", got)
		}
	})

	t.Run("NowNeedsRunningParent", func(t *testing.T) {
		fork := newTestService(t, rt, "nowpaused1", "fork-password",
			&dbcloud.ForkSource{ServiceID: parent.ID, Strategy: dbcloud.ForkNow})
		_, err := rt.EnsureService(ctx, fork)
		if dbcloud.ErrorKindOf(err) != dbcloud.KindUnavailable {
			t.Errorf("NOW fork of a stopped parent: %v", err)
		}
	})

	t.Run("DeleteParentKeepsFilesForRestores", func(t *testing.T) {
		if err := rt.holdParent("pendingfk1", parent.ID); err != nil {
			t.Fatal(err)
		}
		if err := rt.DeleteService(ctx, parent); err != nil {
			t.Fatal(err)
		}
		dir := rt.serviceDir(parent.ID)
		for _, name := range []string{"archive", "snapshots", "deleted"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				t.Errorf("%s gone while a fork restores: %v", name, err)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "0")); err == nil {
			t.Error("the deleted parent's instance remains")
		}
		if err := rt.holdParent("latefork01", parent.ID); !dbcloud.IsTerminal(err) {
			t.Errorf("a new fork of a deleted parent: %v, want a terminal error", err)
		}
		if err := rt.backups.Release(rt.serviceDir(parent.ID), "pendingfk1"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Error("the deleted parent's files remain after the last fork restored")
		}
	})

	t.Run("ForkSurvivesParent", func(t *testing.T) {
		now.Spec.Running = false
		mustEnsure(t, rt, now)
		now.Spec.Running = true
		mustEnsure(t, rt, now)
		if got := rows(t, now, "fork-password"); len(got) != 4 {
			t.Errorf("NOW fork after its parent's deletion and a restart: %q", got)
		}
		if err := rt.MaintainBackups(ctx, now); err != nil {
			t.Fatal(err)
		}
		if s, _ := rt.backups.Snapshots(rt.serviceDir(now.ID)); len(s) != 1 {
			t.Errorf("the fork's own snapshots: %d", len(s))
		}
	})

	// With several snapshots, LAST_SNAPSHOT restores the newest: its rows
	// are there, and none written after it.
	t.Run("LastSnapshotIsNewest", func(t *testing.T) {
		mustExec(t, now, "fork-password", "INSERT INTO t VALUES ('5 before the newest snapshot')")
		src, ok := rt.runningPrimary(now.ID)
		if !ok {
			t.Fatal("the NOW fork's primary is not running")
		}
		newest, err := rt.backups.Take(ctx, rt.serviceDir(now.ID), src)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, now, "fork-password", "INSERT INTO t VALUES ('6 after the newest snapshot')")
		snaps, _ := rt.backups.Snapshots(rt.serviceDir(now.ID))
		if len(snaps) < 2 || snaps[len(snaps)-1].Name != newest.Name {
			t.Fatalf("snapshots %+v: want at least two, the newest %s last", snaps, newest.Name)
		}
		fork := newTestService(t, rt, "lastnewest", "fork-password",
			&dbcloud.ForkSource{ServiceID: now.ID, Strategy: dbcloud.ForkLastSnapshot})
		mustEnsure(t, rt, fork)
		want := []string{"1 before snapshot", "2 after snapshot", "3 after target", "4 in fork", "5 before the newest snapshot"}
		if got := rows(t, fork, "fork-password"); !slices.Equal(got, want) {
			t.Errorf("LAST_SNAPSHOT with %d snapshots: rows %q, want %q (the newest snapshot's)", len(snaps), got, want)
		}
	})
}
