package local

import (
	"fmt"
	"net"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/runtime/local/internal/localtest"
	"dbcloud/runtime/local/internal/proc"
)

func TestParseAppName(t *testing.T) {
	for app, want := range map[string]dbcloud.ReplicationLag{
		appName(2):                   {Ordinal: 2},
		nodeAppName("abcde12345", 0): {ReplicaSetID: "abcde12345", Ordinal: 0},
		nodeAppName("abcde12345", 7): {ReplicaSetID: "abcde12345", Ordinal: 7},
	} {
		if got, ok := parseAppName(app); !ok || got != want {
			t.Errorf("parseAppName(%q) = %+v, %v; want %+v", app, got, ok, want)
		}
	}
	for _, app := range []string{"", "dbcloud", "pg_basebackup", "instance_x", "rs_", "rs_abc_x"} {
		if got, ok := parseAppName(app); ok {
			t.Errorf("parseAppName(%q) = %+v, want no node", app, got)
		}
	}
}

func TestEstablishedOnPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if n := proc.EstablishedOnPort(port); n != 0 {
		t.Fatalf("%d connections before any dial", n)
	}
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	if n := proc.EstablishedOnPort(port); n != 2 {
		t.Errorf("EstablishedOnPort = %d, want the 2 accepted connections", n)
	}
}

// sessionPID is the backend of the service's kept metrics session, 0 when
// it has none.
func sessionPID(rt *Runtime, id string) uint32 {
	rt.sessions.mu.Lock()
	s := rt.sessions.m[id]
	rt.sessions.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return 0
	}
	return s.conn.PgConn().PID()
}

// TestMetrics_KeptSession: a service's samples are read over one kept
// session; a session whose backend ended is replaced within the same
// sample; an ensure (a stop here) closes it first, so no smart shutdown
// waits for it.
func TestMetrics_KeptSession(t *testing.T) {
	rt := mustRuntime(t, localtest.Base(t))
	svc := newTestService(t, rt, "kept", "pw-kept-1", nil)
	mustEnsure(t, rt, svc)
	ctx := t.Context()
	check := func() {
		t.Helper()
		obs, err := rt.CheckService(ctx, svc, true)
		if err != nil || obs.Metrics == nil || obs.Metrics.Database == nil {
			t.Fatalf("check: %+v %v", obs, err)
		}
	}
	check()
	first := sessionPID(rt, svc.ID)
	check()
	if pid := sessionPID(rt, svc.ID); first == 0 || pid != first {
		t.Fatalf("sessions of two samples: backends %d and %d, want one kept", first, pid)
	}
	spec, err := rt.primary(svc)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.instances.Exec(ctx, spec, "postgres", fmt.Sprintf("SELECT pg_terminate_backend(%d)", first)); err != nil {
		t.Fatal(err)
	}
	check()
	if pid := sessionPID(rt, svc.ID); pid == 0 || pid == first {
		t.Errorf("after its backend ended: session backend %d (was %d), want a new one", pid, first)
	}
	svc.Spec.Running = false
	mustEnsure(t, rt, svc)
	if pid := sessionPID(rt, svc.ID); pid != 0 {
		t.Errorf("the stopped service keeps a metrics session (backend %d)", pid)
	}
	// A stop outside an ensure (a failover's fence, a fork's restart)
	// closes it too.
	svc.Spec.Running = true
	mustEnsure(t, rt, svc)
	check()
	if sessionPID(rt, svc.ID) == 0 {
		t.Fatal("no session kept after a sample")
	}
	if err := rt.stopInstance(ctx, spec, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if pid := sessionPID(rt, svc.ID); pid != 0 {
		t.Errorf("the stopped instance keeps a metrics session (backend %d)", pid)
	}
}

// A measurement taken just after a write can miss it (the filesystem
// accounts it when its transaction commits): it is measured again until
// one is taken storageSettle after the counters last moved, and only that
// one is reused while they stay put.
func TestStorageSample_MeasuredAgainUntilTheWriteIsAccounted(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	var s storageSample
	if s.reusable(0, 0, t0) {
		t.Fatal("no measurement yet, but reused")
	}
	s = s.next(10<<20, 100, 5, t0) // the first measurement
	if s.reusable(100, 5, t0.Add(time.Second)) {
		t.Fatal("a measurement as old as the counters' move was reused")
	}
	s = s.next(10<<20, 200, 5, t0.Add(2*time.Second))  // a write: the WAL moved
	s = s.next(10<<20, 200, 5, t0.Add(20*time.Second)) // the filesystem has not committed it yet
	if s.reusable(200, 5, t0.Add(21*time.Second)) {
		t.Fatal("a measurement 18 s after a write was reused; the write may not be accounted in it")
	}
	s = s.next(30<<20, 200, 5, t0.Add(40*time.Second)) // 38 s after the write: accounted
	if !s.reusable(200, 5, t0.Add(41*time.Second)) {
		t.Fatal("a settled measurement with the counters unmoved was measured again")
	}
	if s.reusable(200, 6, t0.Add(41*time.Second)) {
		t.Fatal("reused although a row changed")
	}
	if s.reusable(200, 5, t0.Add(40*time.Second+storageMaxAge)) {
		t.Fatalf("reused after %v", storageMaxAge)
	}
}
