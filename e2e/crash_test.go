package e2e

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// checkNoOrphans: every service directory belongs to a service the API
// knows, and no service has two postmasters.
func (s *server) checkNoOrphans() {
	s.t.Helper()
	var list []service
	s.call("GET", s.services(), nil, &list)
	known := map[string]bool{}
	for _, svc := range list {
		known[svc.ServiceID] = true
		if pids := s.postmasters(svc.ServiceID); len(pids) > 1 {
			s.t.Errorf("service %s has %d postmasters: %v", svc.ServiceID, len(pids), pids)
		}
	}
	dirs, _ := os.ReadDir(filepath.Join(s.dir, "runtime", "services"))
	for _, d := range dirs {
		if !known[d.Name()] {
			s.t.Errorf("orphan service directory %s", d.Name())
		}
	}
}

// TestCrash_DuringCreate kills dbcloud with SIGKILL at several moments of a
// create; after a restart the create completes, with one postmaster.
func TestCrash_DuringCreate(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	for _, delay := range []time.Duration{0, 5 * time.Millisecond, 30 * time.Millisecond, 80 * time.Millisecond} {
		created := s.create(map[string]any{"name": "crash", "cpu_millis": "shared"})
		time.Sleep(delay)
		s.kill()
		s.start()
		svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
		if pids := s.postmasters(svc.ServiceID); len(pids) != 1 {
			t.Errorf("after a crash %v into the create: postmasters %v, want one", delay, pids)
		}
		c := s.mustConnect(svc, created.InitialPassword)
		if err := c.Ping(context.Background()); err != nil {
			t.Errorf("after a crash %v into the create: %v", delay, err)
		}
	}
	s.checkNoOrphans()
}

// TestCrash_DuringResize kills dbcloud while a resize restarts PostgreSQL.
func TestCrash_DuringResize(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "resize", "cpu_millis": "shared"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	c := s.mustConnect(svc, created.InitialPassword)
	if _, err := c.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	for i, size := range []map[string]string{{"cpu_millis": "500", "memory_gbs": "2"}, {"cpu_millis": "1000", "memory_gbs": "4"}} {
		if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/resize", size, nil); code != 202 {
			t.Fatalf("resize: %d", code)
		}
		time.Sleep(time.Duration(i) * 40 * time.Millisecond)
		s.kill()
		s.start()
		s.waitStatus(svc.ServiceID, "READY", 60*time.Second)
		want := map[int]string{0: "512MB", 1: "1GB"}[i]
		var sb string
		var v int
		c := s.mustConnect(svc, created.InitialPassword)
		c.QueryRow(ctx, `SHOW shared_buffers`).Scan(&sb)
		c.QueryRow(ctx, `SELECT v FROM t`).Scan(&v)
		if sb != want || v != 42 {
			t.Errorf("after a crash during resize %d: shared_buffers %s (want %s), row %d", i, sb, want, v)
		}
		if pids := s.postmasters(svc.ServiceID); len(pids) != 1 {
			t.Errorf("postmasters %v, want one", pids)
		}
	}
	s.checkNoOrphans()
}

// TestCrash_Postmaster kills the postmaster: the service shows UNSTABLE,
// comes back READY by itself, and keeps every committed row.
func TestCrash_Postmaster(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "pm", "cpu_millis": "shared"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	c := s.mustConnect(svc, created.InitialPassword)
	if _, err := c.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t SELECT generate_series(1, 1000)`); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	pids := s.postmasters(svc.ServiceID)
	if len(pids) != 1 {
		t.Fatalf("postmasters %v", pids)
	}
	killed, offset := time.Now(), s.logOffset()
	syscall.Kill(pids[0], syscall.SIGKILL)
	reason := s.waitUnhealthy(svc.ServiceID, offset, 60*time.Second)
	t.Logf("UNSTABLE %v after the kill: %s", time.Since(killed).Round(time.Millisecond), reason)
	if reason == "" {
		t.Error("UNSTABLE without a reason")
	}
	s.waitStatus(svc.ServiceID, "READY", 60*time.Second)
	t.Logf("READY %v after the kill", time.Since(killed).Round(time.Millisecond))
	var n int
	if err := s.mustConnect(svc, created.InitialPassword).QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 1000 {
		t.Errorf("rows after the crash: %d, %v; want 1000", n, err)
	}
}

// TestRestart_AdoptsPostmasters restarts dbcloud under a live client
// connection: the postmaster is adopted, not started again, and the
// connection stays up.
func TestRestart_AdoptsPostmasters(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "adopt", "cpu_millis": "shared"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	c := s.mustConnect(svc, created.InitialPassword)
	before := s.postmasters(svc.ServiceID)
	s.restart()
	s.kill() // and once more, without a clean shutdown
	restarted := time.Now()
	s.start()
	s.waitStatus(svc.ServiceID, "READY", 30*time.Second)
	// The engine of the restarted server has checked and measured it.
	s.waitMeasured(svc.ServiceID, restarted, 60*time.Second)
	after := s.postmasters(svc.ServiceID)
	if len(after) != 1 || after[0] != before[0] {
		t.Errorf("postmasters %v before, %v after the restarts; want the same one", before, after)
	}
	var one int
	if err := c.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Errorf("the client connection did not survive the restarts: %v", err)
	}
}
