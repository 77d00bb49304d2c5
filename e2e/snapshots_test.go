package e2e

import (
	"context"
	"testing"
	"time"
)

type snapshotList struct {
	Snapshots []struct {
		Name      string    `json:"name"`
		Finished  time.Time `json:"finished"`
		SizeBytes int64     `json:"size_bytes"`
		StopLSN   string    `json:"stop_lsn"`
		PITRBase  bool      `json:"pitr_base"`
	} `json:"snapshots"`
	RecoveryWindow struct {
		LastSnapshot *time.Time `json:"last_snapshot"`
		PITRFrom     *time.Time `json:"pitr_from"`
		PITRTo       *time.Time `json:"pitr_to"`
	} `json:"recovery_window"`
	LastRestoreCheck *struct {
		Snapshot    string `json:"snapshot"`
		DurationMS  int64  `json:"duration_ms"`
		OK          bool   `json:"ok"`
		Error       string `json:"error"`
		RestoredLSN string `json:"restored_lsn"`
		ExpectedLSN string `json:"expected_lsn"`
	} `json:"last_restore_check"`
}

// TestSnapshots_ListAndEvents lists a service's first snapshot with its
// time, size and LSN and the recovery window that follows from it; the
// event stream reports the snapshot, and the restore of a LAST_SNAPSHOT
// fork from it.
func TestSnapshots_ListAndEvents(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stream, closeStream := s.events(ctx, "")
	defer closeStream()
	created := s.create(map[string]any{"name": "snap"})
	id := created.ServiceID
	s.waitStatus(id, "READY", 90*time.Second)

	var l snapshotList
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if code := s.call("GET", s.services()+"/"+id+"/snapshots", nil, &l); code != 200 {
			t.Fatalf("snapshots: %d", code)
		}
		if len(l.Snapshots) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot 90 s after READY: %+v", l)
		}
	}
	snap := l.Snapshots[len(l.Snapshots)-1]
	if snap.SizeBytes <= 0 || snap.StopLSN == "" || snap.Finished.IsZero() {
		t.Errorf("snapshot %+v", snap)
	}
	if w := l.RecoveryWindow; w.LastSnapshot == nil || !w.LastSnapshot.Equal(snap.Finished) {
		t.Errorf("recovery window %+v, want last_snapshot %v", w, snap.Finished)
	}

	evs := readUntil(t, stream, 0, func(e streamEvent) bool { return e.Type == "snapshot.completed" && e.ResourceID == id })
	if e := evs[len(evs)-1]; e.Snapshot == nil || e.Snapshot.StopLSN != l.Snapshots[0].StopLSN {
		t.Errorf("snapshot event %+v, want stop LSN %s", e, l.Snapshots[0].StopLSN)
	}

	var fork service
	if code := s.call("POST", s.services()+"/"+id+"/forkService", map[string]any{"fork_strategy": "LAST_SNAPSHOT"}, &fork); code != 202 {
		t.Fatalf("fork: %d %+v", code, fork)
	}
	evs = readUntil(t, stream, evs[len(evs)-1].ID, func(e streamEvent) bool {
		return e.Type == "restore.finished" && e.ResourceID == fork.ServiceID
	})
	if e := evs[len(evs)-1]; e.Outcome != "succeeded" || e.Status != "READY" {
		t.Errorf("restore event %+v", e)
	}
}
