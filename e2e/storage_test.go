package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"dbcloud/internal/pgtest"
)

// storageStatus is what a client sees of a service's storage.
type storageStatus struct {
	Status       string `json:"status"`
	StatusReason string `json:"status_reason"`
	Metrics      *struct {
		StorageMB int64 `json:"storage_mb"`
	} `json:"metrics"`
}

// waitStorage polls the service until ok holds of what a client sees.
func (s *server) waitStorage(id string, within time.Duration, what string, ok func(storageStatus) bool) storageStatus {
	s.t.Helper()
	st, held := s.pollStorage(id, within, ok)
	if !held {
		s.t.Fatalf("%s: %s within %v; last %s %q", id, what, within, st.Status, st.StatusReason)
	}
	return st
}

// pollStorage polls the service until ok holds of what a client sees or
// within has passed; it returns the last status read and whether ok held.
func (s *server) pollStorage(id string, within time.Duration, ok func(storageStatus) bool) (storageStatus, bool) {
	deadline := time.Now().Add(within)
	for {
		var st storageStatus
		code := s.call("GET", s.services()+"/"+id, nil, &st)
		if code == 200 && ok(st) {
			return st, true
		}
		if time.Now().After(deadline) {
			return st, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// storageAfterWrite is the service's storage_mb after a write, once it
// shows more than before, or writeShows later what it shows then: a write
// need take no new disk at once (its pages wait in shared buffers for a
// checkpoint, its WAL fills a recycled segment), so a filling loop must
// not insist on growth every round.
func (s *server) storageAfterWrite(id string, before int64) int64 {
	s.t.Helper()
	st, _ := s.pollStorage(id, writeShows, func(st storageStatus) bool { return storageMB(st) > before })
	return max(before, storageMB(st))
}

// writeShows is how long a filling loop waits for its write to show in
// storage_mb: a few health checks' measurements (one every 5 s), each of a
// filesystem that may not have accounted the write yet.
const writeShows = 20 * time.Second

func storageMB(st storageStatus) int64 {
	if st.Metrics == nil {
		return 0
	}
	return st.Metrics.StorageMB
}

// TestStorageLimit: on a btrfs storage image each service is a volume with
// a quota. A tenant that writes towards its limit is made read-only at 95%
// (writes fail with 25006, the status says why and how to get out) while
// another tenant writes on; a resize to a size with a larger limit makes
// it writable again by itself.
func TestStorageLimit(t *testing.T) {
	const limitMB = 400
	s := newServer(t, "--storage-image-gib", "4", "--storage-shared-mib", fmt.Sprint(limitMB),
		"--storage-mib-per-memory-gib", "1024")
	a := s.create(map[string]any{"name": "fills", "cpu_millis": "shared", "memory_gbs": "shared"})
	b := s.create(map[string]any{"name": "other", "cpu_millis": "shared", "memory_gbs": "shared"})
	svcA := s.waitStatus(a.ServiceID, "READY", 90*time.Second)
	svcB := s.waitStatus(b.ServiceID, "READY", 90*time.Second)
	ctx := context.Background()
	connA := s.mustConnect(svcA, a.InitialPassword)
	defer connA.Close(ctx)
	connB := s.mustConnect(svcB, b.InitialPassword)
	defer connB.Close(ctx)
	if _, err := connA.Exec(ctx, "CREATE TABLE fill (pad text)"); err != nil {
		t.Fatal(err)
	}

	// Write in shrinking chunks, each followed by a measurement, until
	// the service turns read-only. What a row costs counts several
	// times: the table, the WAL, its archived copy, WAL preallocated.
	used := storageMB(s.waitStorage(a.ServiceID, 30*time.Second, "measured", func(st storageStatus) bool { return storageMB(st) > 0 }))
	for round := 0; ; round++ {
		if round > 40 {
			t.Fatalf("never read-only at %d of %d MB", used, limitMB)
		}
		// About 3,500 rows a MB; a MB of rows costs about four on disk,
		// so each round takes half of what is left below 95%.
		chunkMB := max(1, (limitMB*95/100-used)/8)
		_, err := connA.Exec(ctx, "INSERT INTO fill SELECT repeat(md5(g::text), 8) FROM generate_series(1, $1) g", chunkMB*3500)
		if state := pgtest.SQLState(err); state == "25006" {
			t.Logf("read-only after %d rounds at %d MB: %v", round, used, err)
			break
		} else if err != nil {
			t.Fatalf("write at %d of %d MB: %v (SQLSTATE %s), want 25006 before the quota", used, limitMB, err, state)
		}
		used = s.storageAfterWrite(a.ServiceID, used)
	}
	st := s.waitStorage(a.ServiceID, 30*time.Second, "READY, saying it is at its storage limit and how to get out", func(st storageStatus) bool {
		return st.Status == "READY" && strings.Contains(st.StatusReason, "storage limit") && strings.Contains(st.StatusReason, "resize")
	})
	t.Logf("status: %s %q", st.Status, st.StatusReason)
	if _, err := connA.Exec(ctx, "INSERT INTO fill VALUES ('one more')"); pgtest.SQLState(err) != "25006" {
		t.Fatalf("write on a read-only service: %v, want 25006", err)
	}
	if _, err := connA.Exec(ctx, "SELECT count(*) FROM fill"); err != nil {
		t.Fatalf("read on a read-only service: %v", err)
	}
	if _, err := connB.Exec(ctx, "CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g"); err != nil {
		t.Fatalf("the other service's write: %v", err)
	}

	// A size with a larger limit: writable again, by itself.
	path := s.services() + "/" + a.ServiceID
	if code := s.call("POST", path+"/resize", map[string]string{"cpu_millis": "500", "memory_gbs": "2"}, nil); code != 202 {
		t.Fatalf("resize: %d", code)
	}
	s.waitStatus(a.ServiceID, "READY", 2*time.Minute)
	connA.Close(ctx)
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := s.connect(ctx, svcA, a.InitialPassword)
		if err == nil {
			_, err = c.Exec(ctx, "INSERT INTO fill VALUES ('after the resize')")
			c.Close(ctx)
			if err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("write after a resize to a larger limit: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.waitStorage(a.ServiceID, 30*time.Second, "a status that no longer says writes are refused", func(st storageStatus) bool {
		return st.Status == "READY" && !strings.Contains(st.StatusReason, "refused")
	})
}
