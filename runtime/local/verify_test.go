package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"dbcloud"

	"dbcloud/runtime/local/internal/localtest"
)

// TestRuntime_VerifyRestore: the newest snapshot and the WAL archived after
// it restore into a scratch instance that reaches the archive's last
// transaction and passes pg_amcheck; the scratch instance is gone after,
// the result is kept for the API; a snapshot corrupted on purpose fails the
// check loudly.
func TestRuntime_VerifyRestore(t *testing.T) {
	ctx := context.Background()
	rt := mustRuntime(t, localtest.Base(t))
	svc := newTestService(t, rt, "verify0001", "verify-password", nil)
	mustEnsure(t, rt, svc)
	mustExec(t, svc, "verify-password", "CREATE TABLE t (v int PRIMARY KEY, pad text); INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 5000) g")
	if err := rt.MaintainBackups(ctx, svc); err != nil {
		t.Fatal(err)
	}
	// After the snapshot: a transaction that only the archive holds.
	mustExec(t, svc, "verify-password", "INSERT INTO t SELECT g, 'after' FROM generate_series(5001, 5100) g")
	primary, err := rt.primary(svc)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.instances.Exec(ctx, primary, "postgres", "SELECT pg_switch_wal()"); err != nil {
		t.Fatal(err)
	}
	pollArchived(t, rt, svc)

	check, err := rt.VerifyRestore(ctx, svc)
	if err != nil || check == nil {
		t.Fatalf("verify: %+v, %v", check, err)
	}
	if !check.OK || check.Error != "" || check.RestoredLSN == "" || check.Duration <= 0 {
		t.Fatalf("verify of a good snapshot: %+v", check)
	}
	t.Logf("restore verified in %v: %s reached (expected %s)", check.Duration, check.RestoredLSN, check.ExpectedLSN)
	if _, err := os.Stat(filepath.Join(rt.cfg.DataDir, "scratch", svc.ID+"-verify")); !os.IsNotExist(err) {
		t.Errorf("scratch instance left behind: %v", err)
	}
	if last, err := rt.LastRestoreCheck(svc); err != nil || last == nil || last.Snapshot != check.Snapshot || !last.OK {
		t.Errorf("last check kept: %+v, %v", last, err)
	}

	// Corrupt the tuples at the end of the table's first heap page in the
	// snapshot: their headers now name transactions from the future.
	conn, err := rt.instances.Connect(ctx, primary, "tsdb")
	if err != nil {
		t.Fatal(err)
	}
	var rel string
	err = conn.QueryRow(ctx, "SELECT pg_relation_filepath('public.t')").Scan(&rel)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := rt.backups.Snapshots(rt.serviceDir(svc.ID))
	if err != nil || len(snaps) == 0 {
		t.Fatal(snaps, err)
	}
	heap := filepath.Join(snaps[len(snaps)-1].DataDir(), rel)
	f, err := os.OpenFile(heap, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	garbage := []byte(strings.Repeat("\x7f", 1000))
	if _, err := f.WriteAt(garbage, 8192-1000); err != nil {
		t.Fatal(err)
	}
	f.Close()

	bad, err := rt.VerifyRestore(ctx, svc)
	if err != nil || bad == nil {
		t.Fatalf("verify of a corrupt snapshot: %+v, %v", bad, err)
	}
	if bad.OK || bad.Error == "" {
		t.Fatalf("a corrupt snapshot verified: %+v", bad)
	}
	t.Logf("corrupt snapshot: %s", bad.Error)
	if last, _ := rt.LastRestoreCheck(svc); last == nil || last.OK {
		t.Errorf("last check after the corrupt one: %+v", last)
	}

	// A check interrupted by a crash leaves its instance running as the
	// service's user; the service's delete removes it (so does the next
	// backup work).
	scratch, err := rt.scratchSpec(svc)
	if err != nil {
		t.Fatal(err)
	}
	rt.restoreScratch(ctx, scratch, snaps[len(snaps)-1], svc.ID) // fails its amcheck: the instance runs on
	if _, ok := rt.instances.Running(scratch); !ok {
		t.Fatal("no scratch instance to leave behind")
	}
	if err := rt.DeleteService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if _, ok := rt.instances.Running(scratch); ok {
		t.Error("the delete left the scratch instance running")
	}
	if _, err := os.Stat(scratch.Dir); !os.IsNotExist(err) {
		t.Errorf("the delete left the scratch directory: %v", err)
	}
}

// pollArchived waits until the service's archive holds every segment the
// primary has finished (archive_status has no .ready file left).
func pollArchived(t *testing.T, rt *Runtime, svc *dbcloud.Service) {
	t.Helper()
	status := filepath.Join(rt.serviceDir(svc.ID), "0", "pgdata", "pg_wal", "archive_status")
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready, _ := filepath.Glob(filepath.Join(status, "*.ready"))
		if len(ready) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("WAL not archived within 30 s: %v", ready)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestFirstLines(t *testing.T) {
	out := "heap table \"tsdb.public.t\", block 0, offset 1:\n    multixact should not be marked committed\nheap table \"tsdb.public.t\", block 0, offset 2:\n    xmin in the future\nthird\n"
	want := `heap table "tsdb.public.t", block 0, offset 1: multixact should not be marked committed; heap table "tsdb.public.t", block 0, offset 2: xmin in the future ...`
	if got := firstLines(out, 4); got != want {
		t.Errorf("firstLines = %q, want %q", got, want)
	}
}
