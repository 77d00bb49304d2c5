package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
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

// TestCrash_AcknowledgedWritesSurvive kills dbcloud with SIGKILL in the
// middle of a burst of concurrent writes (VPC creates, renames and deletes
// from many clients, and service creates), three times; after each restart
// every write that was answered 2xx is there. A write that got no answer
// may or may not have happened, and either is accepted.
func TestCrash_AcknowledgedWritesSurvive(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--quota-vpcs", "100000")
	const writers, perRound = 16, 150
	ws := make([]*crashWriter, writers)
	for i := range ws {
		ws[i] = &crashWriter{s: s, id: i, vpcs: map[string][]string{}}
	}
	services := &crashServiceWriter{s: s}
	for round := range 3 {
		var acked atomic.Int64
		var wg sync.WaitGroup
		for _, w := range ws {
			wg.Go(func() { w.run(&acked) })
		}
		wg.Go(func() { services.run(&acked) })
		for deadline := time.Now().Add(2 * time.Minute); acked.Load() < perRound; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: only %d writes answered in 2 minutes", round, acked.Load())
			}
		}
		s.kill()
		wg.Wait()
		s.start()
		t.Logf("round %d: killed after %d answered writes", round, acked.Load())
		checkCrashWrites(t, s, ws, services)
	}
}

// crashWriter is one client writing its own VPCs until a request gets no
// answer (the server died).
type crashWriter struct {
	s   *server
	id  int
	seq int
	// vpcs maps each VPC to the names it may have now: the last one
	// answered, and one sent without an answer; "" is gone.
	vpcs map[string][]string
	// unanswered are names of creates that got no answer.
	unanswered []string
}

func (w *crashWriter) run(acked *atomic.Int64) {
	vpcs := "/projects/" + w.s.boot.ProjectID + "/vpcs"
	for {
		var live []string
		for id, names := range w.vpcs {
			if len(names) == 1 && names[0] != "" {
				live = append(live, id)
			}
		}
		slices.Sort(live)
		w.seq++
		name := fmt.Sprintf("w%d-%d", w.id, w.seq)
		var code int
		var err error
		switch {
		case len(live) < 3:
			var v struct{ ID string }
			code, err = w.s.do("POST", vpcs, map[string]string{"name": name, "cidr": fmt.Sprintf("10.%d.%d.0/24", w.id, w.seq%256), "region_code": "local"}, &v)
			if err != nil {
				w.unanswered = append(w.unanswered, name)
			} else if code == 201 {
				w.vpcs[v.ID] = []string{name}
			}
		case w.seq%4 == 0:
			id := live[w.seq%len(live)]
			code, err = w.s.do("DELETE", vpcs+"/"+id, nil, nil)
			w.record(id, "", code, 204, err)
		default:
			id := live[w.seq%len(live)]
			code, err = w.s.do("POST", vpcs+"/"+id+"/rename", map[string]string{"name": name}, nil)
			w.record(id, name, code, 200, err)
		}
		if err != nil {
			return
		}
		if code/100 == 2 {
			acked.Add(1)
		}
	}
}

// record notes the outcome of a write to VPC id that would leave it named
// name.
func (w *crashWriter) record(id, name string, code, ok int, err error) {
	switch {
	case err != nil:
		w.vpcs[id] = append(w.vpcs[id], name)
	case code == ok:
		w.vpcs[id] = []string{name}
	}
}

// crashServiceWriter creates services (answered 202) until two are
// accepted: each is a real PostgreSQL.
type crashServiceWriter struct {
	s        *server
	accepted []string
}

func (w *crashServiceWriter) run(acked *atomic.Int64) {
	for len(w.accepted) < 2 {
		var created service
		code, err := w.s.do("POST", w.s.services(), map[string]any{"name": fmt.Sprintf("crash-%d", len(w.accepted)), "cpu_millis": "shared"}, &created)
		if err != nil {
			return
		}
		if code == 202 {
			w.accepted = append(w.accepted, created.ServiceID)
			acked.Add(1)
		}
	}
}

// checkCrashWrites lists VPCs and services after a restart and compares
// them with what the writers were answered.
func checkCrashWrites(t *testing.T, s *server, ws []*crashWriter, services *crashServiceWriter) {
	t.Helper()
	var listed []struct{ ID, Name string }
	if code := s.call("GET", "/projects/"+s.boot.ProjectID+"/vpcs", nil, &listed); code != 200 {
		t.Fatalf("list VPCs: %d", code)
	}
	have := map[string]string{}
	for _, v := range listed {
		have[v.ID] = v.Name
	}
	unanswered := map[string]bool{}
	for _, w := range ws {
		for _, name := range w.unanswered {
			unanswered[name] = true
		}
		for id, names := range w.vpcs {
			if got := have[id]; !slices.Contains(names, got) {
				t.Errorf("VPC %s is %q after the crash (\"\" is gone); the answered writes leave one of %q", id, got, names)
			}
			w.vpcs[id] = []string{have[id]}
			delete(have, id)
		}
	}
	for id, name := range have {
		if !unanswered[name] {
			t.Errorf("VPC %s (%s) is listed, but no create of it was sent", id, name)
		}
	}
	var list []service
	s.call("GET", s.services(), nil, &list)
	for _, id := range services.accepted {
		if !slices.ContainsFunc(list, func(svc service) bool { return svc.ServiceID == id }) {
			t.Errorf("service %s, created with 202, is not listed after the crash", id)
		}
	}
}
