package backup

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"dbcloud/internal/flock"
	"dbcloud/runtime/local/postgres"
)

// writeSnapshot makes a snapshot directory by hand: its manifest, and the
// data files a restore needs unless whole is false (a snapshot whose
// data/ is gone, as a clean-up of another plane once left one).
func writeSnapshot(t *testing.T, serviceDir, name string, finished time.Time, whole bool) {
	t.Helper()
	dir := filepath.Join(SnapshotsDir(serviceDir), name)
	s := Snapshot{Name: name, Finished: finished, StartWAL: "000000010000000000000002", StopWAL: "000000010000000000000003"}
	if whole {
		for _, f := range []string{"PG_VERSION", "backup_label", "pg_wal/" + s.StartWAL, "pg_wal/" + s.StopWAL} {
			path := filepath.Join(dir, snapshotDataDir, f)
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	raw, _ := json.Marshal(s)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, snapshotManifest), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshots_SkipsIncomplete: a snapshot with a manifest but without
// its data is not listed, so no fork or recovery window relies on it.
func TestSnapshots_SkipsIncomplete(t *testing.T) {
	svc := t.TempDir()
	now := time.Now().UTC()
	writeSnapshot(t, svc, "20261123T093204.649Z", now.Add(-time.Hour), false)
	writeSnapshot(t, svc, "20261123T103204.649Z", now, true)
	snaps, err := New(nil, "", nil).Snapshots(svc)
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 1 || snaps[0].Name != "20261123T103204.649Z" {
		t.Fatalf("snapshots = %+v, want only the whole one", snaps)
	}
}

// TestMaintain_LeavesAnotherPlanesSnapshotAlone: while another process
// holds the service's snapshot lock (another control plane taking a
// snapshot on the shared runtime directory), Maintain neither snapshots
// nor removes that process's work in progress.
func TestMaintain_LeavesAnotherPlanesSnapshotAlone(t *testing.T) {
	svc := t.TempDir()
	if err := os.MkdirAll(SnapshotsDir(svc), 0o700); err != nil {
		t.Fatal(err)
	}
	other, ok, err := flock.TryLock(filepath.Join(SnapshotsDir(svc), snapshotsLock))
	if err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	inProgress := filepath.Join(SnapshotsDir(svc), snapshotTmpPrefix+"20261123T093204.649Z.4242")
	if err := os.Mkdir(inProgress, 0o700); err != nil {
		t.Fatal(err)
	}
	b := New(nil, "", nil)
	primary := func() (postgres.Spec, bool) {
		t.Error("Maintain looked for a primary to snapshot while another process holds the lock")
		return postgres.Spec{}, false
	}
	if err := b.Maintain(t.Context(), svc, Policy{Interval: time.Hour, Retention: time.Hour}, primary); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(inProgress); err != nil {
		t.Fatalf("the other process's snapshot in progress: %v", err)
	}
	// Once the other process is gone (its lock with it), this one does
	// the service's backup work (and its next snapshot removes the
	// leftover).
	other.Unlock()
	called := false
	primary = func() (postgres.Spec, bool) { called = true; return postgres.Spec{}, false }
	if err := b.Maintain(t.Context(), svc, Policy{Interval: time.Hour, Retention: time.Hour}, primary); err != nil {
		t.Fatal(err)
	}
	if !called {
		t.Fatal("Maintain did not look for a primary once the lock was free")
	}
}
