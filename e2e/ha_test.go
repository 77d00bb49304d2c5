package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// haPrimary reads which instance is the service's primary from the
// runtime's ha.json.
func (s *server) haPrimary(id string) (int, int) {
	raw, err := os.ReadFile(filepath.Join(s.dir, "runtime", "services", id, "ha.json"))
	if err != nil {
		s.t.Fatal(err)
	}
	var st struct {
		Primary int         `json:"primary"`
		Ports   map[int]int `json:"ports"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		s.t.Fatal(err)
	}
	return st.Primary, st.Ports[st.Primary]
}

// TestHA creates a service with two standbys (one synchronous), reads a
// row on a standby, then fails the primary twice, by SIGKILL and by
// removing its data directory, while a writer records every acknowledged
// commit, and checks that every one is on the new primary and that the
// service goes UNSTABLE and READY again. Then it restarts dbcloud and
// checks an open connection survives. (How long failover takes is
// measured by BenchmarkFailover.)
func TestHA(t *testing.T) {
	s := newServer(t)
	svc, password := s.haService(t)
	ctx := context.Background()
	primary, _ := s.haPrimary(svc.ServiceID)

	// Read on a standby, straight on its internal port.
	for n := 0; n < 3; n++ {
		if n == primary {
			continue
		}
		pf, _ := os.ReadFile(filepath.Join(s.dir, "runtime", "services", svc.ServiceID, strconv.Itoa(n), "pgdata", "postmaster.pid"))
		lines := strings.Split(string(pf), "\n")
		if len(lines) < 4 {
			t.Fatalf("standby %d has no postmaster.pid", n)
		}
		sb := svc
		sb.Endpoint.Port, _ = strconv.Atoi(strings.TrimSpace(lines[3]))
		deadline := time.Now().Add(5 * time.Second)
		for {
			sc, err := s.connect(ctx, sb, password)
			if err != nil {
				t.Fatal(err)
			}
			var rows int
			var standby bool
			sc.QueryRow(ctx, "SELECT count(*), pg_is_in_recovery() FROM acked").Scan(&rows, &standby)
			sc.Close(ctx)
			if rows == 1 && standby {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("standby %d: rows %d, in recovery %v", n, rows, standby)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	for i, c := range []struct {
		name   string
		break_ func(testing.TB, string)
	}{{"SIGKILL of the primary", killPrimary}, {"data directory of the primary removed", removePrimaryData}} {
		offset := s.logOffset()
		r := s.failover(t, svc, password, i*1_000_000, c.break_)
		t.Logf("%s to the first write acknowledged by the new primary: %v; %d acknowledged commits, all on the new primary",
			c.name, r.took, r.acked)
		if !r.sawUnstable {
			t.Errorf("%s: the service was not shown UNSTABLE during the failover", c.name)
		}
		if i == 0 {
			s.exitStartedFailover(t, svc.ServiceID, offset)
		}
	}
	svc = s.waitStatus(svc.ServiceID, "READY", 60*time.Second)
	if len(svc.Resources) != 3 {
		t.Errorf("resources after failover %+v", svc.Resources)
	}
	c2 := s.mustConnect(svc, password)

	// The endpoint is served by the proxy process, not by dbcloud: an open
	// session survives a restart of dbcloud.
	s.restart()
	var one int
	if err := c2.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("session did not survive a restart of dbcloud: %v", err)
	}
	s.waitStatus(svc.ServiceID, "READY", 30*time.Second)
}

// exitStartedFailover checks that the failover after a SIGKILL of the
// primary was started by the exit of its postmaster, seen as it happened,
// and not by a health check that found it gone: the engine was told of the
// failure, and the failover operation names the exit as its cause.
func (s *server) exitStartedFailover(t *testing.T, id string, offset int64) {
	t.Helper()
	if len(s.logLines(offset, "service failure noticed; checking it now", id)) == 0 {
		t.Error("SIGKILL of the primary: the engine was not told of the failure")
	}
	for _, op := range s.operations(id) {
		if op.Type == "failover" {
			if !strings.Contains(op.Reason, "exited") {
				t.Errorf("the last failover's reason %q does not name the postmaster's exit", op.Reason)
			}
			return
		}
	}
	t.Error("no failover operation recorded")
}

// haService creates a PROD service with two HA standbys, one of them
// synchronous, and a table acked (id int primary key) with one row.
func (s *server) haService(t testing.TB) (service, string) {
	t.Helper()
	// Created with its replicas; which are synchronous is setHA's to say.
	created := s.create(map[string]any{"name": "ha", "cpu_millis": "shared", "environment_tag": "PROD", "replica_count": 2})
	svc := s.waitStatus(created.ServiceID, "READY", 90*time.Second)
	if len(svc.Resources) != 3 {
		t.Fatalf("resources %+v, want 3", svc.Resources)
	}
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/setHA", map[string]int{"replica_count": 2, "sync_replica_count": 1}, nil); code != 202 {
		t.Fatalf("setHA: %d", code)
	}
	// The service can still show READY before the queued setHA starts:
	// wait for its operations, then for READY, so the caller's next write
	// does not meet a pending operation (409).
	for _, op := range s.operations(created.ServiceID) {
		if op.State == "pending" {
			s.waitOperation(op.ID, 60*time.Second)
		}
	}
	s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	c := s.mustConnect(svc, created.InitialPassword)
	defer c.Close(context.Background())
	if _, err := c.Exec(context.Background(), "CREATE TABLE acked (id int PRIMARY KEY); INSERT INTO acked VALUES (-1)"); err != nil {
		t.Fatal(err)
	}
	return svc, created.InitialPassword
}

// killPrimary sends SIGKILL to the postmaster of the instance directory.
func killPrimary(t testing.TB, dir string) {
	pf, err := os.ReadFile(filepath.Join(dir, "pgdata", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.SplitN(string(pf), "\n", 2)[0])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// removePrimaryData removes the instance's data directory under its
// running postmaster, as a lost disk would.
func removePrimaryData(t testing.TB, dir string) {
	// The postmaster goes on creating files while they are removed, which
	// RemoveAll reports as "directory not empty": remove until it is gone.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := os.RemoveAll(filepath.Join(dir, "pgdata"))
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}

// failover breaks the primary of an HA service (whose database has a table
// acked (id int primary key)) while a writer through the endpoint records
// every acknowledged commit, and returns how long after the break the new
// primary acknowledged its first write. It fails t if an acknowledged
// commit is missing afterwards, if the endpoint then reaches a standby or
// if the service is not READY again with every instance. Ids from from on
// are written.
func (s *server) failover(t testing.TB, svc service, password string, from int, breakPrimary func(t testing.TB, dir string)) failoverResult {
	t.Helper()
	ctx := context.Background()
	w := s.startWriter(svc, password, from, false)
	// Writes flow before the break.
	w.waitAcks(t, 50, time.Time{}, anyServer, 30*time.Second)
	primary, oldPort := s.haPrimary(svc.ServiceID)
	broken, offset := time.Now(), s.logOffset()
	breakPrimary(t, filepath.Join(s.dir, "runtime", "services", svc.ServiceID, strconv.Itoa(primary)))
	first := w.waitFirst(t, 1, broken, func(a ack) bool { return a.port != oldPort }, 60*time.Second)
	firstOK := first.at
	// A few writes on the new primary too.
	w.waitAcks(t, 10, firstOK, anyServer, 60*time.Second)
	acks := w.halt()
	// READY again with every instance: the old primary is rebuilt.
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got, _ := s.get(svc.ServiceID)
		if got.Status == "READY" && len(got.Resources) == 3 && s.instancesRunning(svc.ServiceID) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not READY with every standby running within 90 s of the failover: %+v", got)
		}
	}
	if now, _ := s.haPrimary(svc.ServiceID); now == primary {
		t.Fatalf("primary is still instance %d", primary)
	}
	c := s.mustConnect(svc, password)
	defer c.Close(ctx)
	var inRecovery bool
	if err := c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || inRecovery {
		t.Fatalf("the endpoint reaches a standby (%v)", err)
	}
	if missing := lostAcks(t, c, acks); len(missing) > 0 {
		t.Fatalf("%d of %d acknowledged commits lost: %v", len(missing), len(acks), missing)
	}
	// The engine showed the service UNSTABLE during the failover, however
	// briefly: its log line comes after the status change committed.
	sawUnstable := len(s.logLines(offset, "service unhealthy", svc.ServiceID)) > 0
	return failoverResult{broken: broken, took: firstOK.Sub(broken), acked: len(acks), sawUnstable: sawUnstable, first: first}
}

type failoverResult struct {
	broken      time.Time     // when the primary was broken
	took        time.Duration // break to the first write acknowledged by the new primary
	acked       int           // commits acknowledged, all found on the new primary
	sawUnstable bool          // the service was shown UNSTABLE meanwhile
	first       ack           // the first write acknowledged by the new primary
}

// instancesRunning counts the instances of a service with a live
// postmaster (postmaster.pid of a running process).
func (s *server) instancesRunning(id string) int {
	files, _ := filepath.Glob(filepath.Join(s.dir, "runtime", "services", id, "[0-9]*", "pgdata", "postmaster.pid"))
	n := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.SplitN(string(raw), "\n", 2)[0]); err == nil && syscall.Kill(pid, 0) == nil {
			n++
		}
	}
	return n
}
