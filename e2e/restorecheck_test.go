package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func (s *server) waitRestoreCheck(id string, within time.Duration, what string, ok func(snapshotList) bool) snapshotList {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var l snapshotList
		if code := s.call("GET", s.services()+"/"+id+"/snapshots", nil, &l); code == 200 && ok(l) {
			return l
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: no restore check %s within %v; last %+v", id, what, within, l.LastRestoreCheck)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestRestoreCheck: after a snapshot, its restore is verified and the
// result shows in the API (GET .../snapshots), with the time it took; a
// snapshot corrupted on purpose fails its check loudly: the API says what
// pg_amcheck found and the service's status_reason says the check failed.
func TestRestoreCheck(t *testing.T) {
	s := newServer(t, "--restore-check-interval", "1s")
	streamCtx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stream, closeStream := s.events(streamCtx, "")
	defer closeStream()
	created := s.create(map[string]any{"name": "checked"})
	svc := s.waitStatus(created.ServiceID, "READY", 90*time.Second)
	ctx := context.Background()
	conn := s.mustConnect(svc, created.InitialPassword)
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE t AS SELECT g AS v, repeat('x', 100) AS pad FROM generate_series(1, 5000) g"); err != nil {
		t.Fatal(err)
	}
	var rel string
	if err := conn.QueryRow(ctx, "SELECT pg_relation_filepath('t')").Scan(&rel); err != nil {
		t.Fatal(err)
	}
	first := s.waitRestoreCheck(svc.ServiceID, 2*time.Minute, "of the first snapshot", func(l snapshotList) bool {
		return l.LastRestoreCheck != nil
	})
	// The snapshot taken at creation holds no table: without snapshots the
	// runtime takes a fresh one at once, and verifies it.
	snapshots := filepath.Join(s.runtimeDir(), "services", svc.ServiceID, "snapshots")
	if err := os.RemoveAll(snapshots); err != nil {
		t.Fatal(err)
	}
	good := s.waitRestoreCheck(svc.ServiceID, 2*time.Minute, "of a snapshot with the table", func(l snapshotList) bool {
		c := l.LastRestoreCheck
		return c != nil && c.Snapshot != first.LastRestoreCheck.Snapshot && len(l.Snapshots) == 1 && c.Snapshot == l.Snapshots[0].Name
	})
	c := good.LastRestoreCheck
	if !c.OK || c.Error != "" || c.DurationMS <= 0 || c.RestoredLSN == "" || c.ExpectedLSN == "" {
		t.Fatalf("check of a good snapshot: %+v", c)
	}
	t.Logf("restore of %s verified in %d ms, recovered to %s (expected %s)", c.Snapshot, c.DurationMS, c.RestoredLSN, c.ExpectedLSN)

	// Corrupt the table's heap in that snapshot; a day later (the check's
	// record removed) it is verified again.
	heap := filepath.Join(snapshots, c.Snapshot, "data", rel)
	f, err := os.OpenFile(heap, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(strings.Repeat("\x7f", 1000)), 8192-1000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Remove(filepath.Join(s.runtimeDir(), "services", svc.ServiceID, "restore-check.json")); err != nil {
		t.Fatal(err)
	}
	bad := s.waitRestoreCheck(svc.ServiceID, 2*time.Minute, "that fails", func(l snapshotList) bool {
		return l.LastRestoreCheck != nil && !l.LastRestoreCheck.OK
	})
	if !strings.Contains(bad.LastRestoreCheck.Error, "pg_amcheck") {
		t.Errorf("failed check says %q, want what pg_amcheck found", bad.LastRestoreCheck.Error)
	}
	// The stream reports each check, the failed one with its reason, and
	// the READY service's new status_reason.
	var checks []string
	var notice bool
	readUntil(t, stream, 0, func(ev streamEvent) bool {
		if ev.ResourceID == svc.ServiceID && ev.Type == "restore_check.finished" {
			checks = append(checks, ev.Status)
		}
		if ev.ResourceID == svc.ServiceID && ev.Type == "service.notice" && strings.Contains(ev.Reason, "restore check") {
			notice = true
		}
		return notice && len(checks) > 0 && checks[len(checks)-1] == "failed"
	})
	if len(checks) < 3 || checks[0] != "ok" {
		t.Errorf("restore check events %v, want ok ones before the failed one", checks)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got, _ := s.get(svc.ServiceID)
		if strings.Contains(got.StatusReason, "restore check") {
			t.Logf("status after a failed check: %s %q", got.Status, got.StatusReason)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status after a failed restore check: %s %q", got.Status, got.StatusReason)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
