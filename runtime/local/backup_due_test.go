package local

import (
	"testing"
	"time"

	"dbcloud"
	"dbcloud/runtime/local/backup"
)

// TestBackupsDue: after a maintenance that left snapshots, nothing is due
// until the next snapshot, prune or restore check could be, or
// backupRevisit; without snapshots the next round looks again.
func TestBackupsDue(t *testing.T) {
	svc := &dbcloud.Service{ID: "s1"}
	now := time.Now()
	for _, tc := range []struct {
		name        string
		cfg         Config
		snaps       []backup.Snapshot
		wantQuiet   bool
		quietAtMost time.Duration
	}{
		{"no snapshot yet", Config{}, nil, false, 0},
		{"fresh snapshot", Config{}, []backup.Snapshot{{Finished: now}}, true, backupRevisit},
		{"next snapshot due in 2 s", Config{SnapshotInterval: 10 * time.Second},
			[]backup.Snapshot{{Finished: now.Add(-8 * time.Second)}}, true, 2 * time.Second},
		{"next snapshot overdue", Config{SnapshotInterval: 10 * time.Second},
			[]backup.Snapshot{{Finished: now.Add(-time.Minute)}}, false, 0},
		{"restore checks every second", Config{RestoreCheckInterval: time.Second},
			[]backup.Snapshot{{Finished: now}}, true, time.Second},
		{"oldest snapshot expires in 3 s", Config{SnapshotRetention: time.Hour},
			[]backup.Snapshot{{Finished: now.Add(-2 * time.Hour)}, {Finished: now.Add(-time.Hour + 3*time.Second)}, {Finished: now}}, true, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &Runtime{cfg: tc.cfg, quiet: map[string]time.Time{}}
			if !rt.BackupsDue(svc) {
				t.Fatal("never maintained, yet not due")
			}
			rt.noteBackups(svc.ID, tc.snaps)
			if got := !rt.BackupsDue(svc); got != tc.wantQuiet {
				t.Fatalf("quiet %v, want %v", got, tc.wantQuiet)
			}
			if tc.wantQuiet {
				if until := rt.quiet[svc.ID]; time.Until(until) > tc.quietAtMost {
					t.Errorf("quiet for %v, want at most %v", time.Until(until), tc.quietAtMost)
				}
			}
		})
	}
}
