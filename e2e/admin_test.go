package e2e

import (
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"dbcloud/internal/chaos"
)

// tryAdmin runs `dbcloud admin ARGS --data-dir DIR` and returns its text output
// and whether it succeeded.
func (s *server) tryAdmin(args ...string) (string, bool) {
	s.t.Helper()
	cmd := exec.Command(binary, append(append([]string{"admin"}, args...), "--data-dir", s.dir)...)
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// TestAdmin_ServicesAndTeardown uses the operator's commands as a person
// who is done would: list and show services, stop them all, and, after
// stopping dbcloud, tear everything down. Afterwards no process, listening
// port, cgroup or directory of a service is left (the chaos checker's
// observation of the host), and the store has no service.
func TestAdmin_ServicesAndTeardown(t *testing.T) {
	s := newServer(t)
	a := s.create(map[string]any{"name": "first"})
	b := s.create(map[string]any{"name": "second", "cpu_millis": "shared"})
	ids, password := []string{a.ServiceID, b.ServiceID}, a.InitialPassword
	a = s.waitStatus(a.ServiceID, "READY", 90*time.Second)
	s.waitStatus(b.ServiceID, "READY", 90*time.Second)
	if code := s.call("POST", s.services()+"/"+b.ServiceID+"/enablePooler", nil, nil); code != 200 {
		t.Fatalf("enablePooler: %d", code)
	}
	b = s.waitStatus(b.ServiceID, "READY", 60*time.Second)

	out, ok := s.tryAdmin("service", "list", "--project", s.boot.ProjectID)
	if !ok || !strings.Contains(out, a.ServiceID) || !strings.Contains(out, b.ServiceID) || !strings.Contains(out, "READY") {
		t.Fatalf("service list:\n%s", out)
	}
	out, ok = s.tryAdmin("service", "show", "--project", s.boot.ProjectID, "--id", a.ServiceID)
	want := "postgresql://tsdbadmin@127.0.0.1:" + strconv.Itoa(a.Endpoint.Port) + "/tsdb?"
	if !ok || !strings.Contains(out, want) || password == "" || strings.Contains(out, password) {
		t.Fatalf("service show (want %s, no password):\n%s", want, out)
	}

	// Stop everything while dbcloud runs: its engine does the work.
	out, ok = s.tryAdmin("service", "stop-all")
	if !ok || !strings.Contains(out, "stopped 2 services") {
		t.Fatalf("stop-all:\n%s", out)
	}
	for _, id := range ids {
		if svc, _ := s.get(id); svc.Status != "PAUSED" {
			t.Errorf("after stop-all, %s is %s", id, svc.Status)
		}
	}
	for _, id := range ids {
		if code := s.call("POST", s.services()+"/"+id+"/start", nil, nil); code != 202 {
			t.Fatalf("start %s: %d", id, code)
		}
	}
	for _, id := range ids {
		s.waitStatus(id, "READY", 60*time.Second)
	}

	// Teardown refuses while dbcloud runs.
	if out, ok := s.tryAdmin("teardown"); ok || !strings.Contains(out, "stop it first") {
		t.Fatalf("teardown with dbcloud running:\n%s", out)
	}
	s.stop()
	runtimeDir := filepath.Join(s.dir, "runtime")
	var before chaos.World
	if err := chaos.ObserveHost(runtimeDir, ids, &before); err != nil {
		t.Fatal(err)
	}
	if len(before.Processes) < 3 { // two postmasters, a pooler
		t.Fatalf("before teardown, processes %+v", before.Processes)
	}
	// Each prepared cluster of the pool has an OS user of its own (as
	// root), which removing the directory alone would leave on the host.
	var poolUsers []string
	entries, _ := filepath.Glob(filepath.Join(runtimeDir, "pool", "ready-*"))
	for _, e := range entries {
		poolUsers = append(poolUsers, "dbc-p-"+strings.TrimPrefix(filepath.Base(e), "ready-"))
	}
	if os.Geteuid() == 0 {
		if len(poolUsers) == 0 {
			t.Fatal("before teardown, the pool has no prepared cluster")
		}
		for _, u := range poolUsers {
			if _, err := user.Lookup(u); err != nil {
				t.Fatalf("OS user of pool entry: %v", err)
			}
		}
	}
	out, ok = s.tryAdmin("teardown")
	if !ok || !strings.Contains(out, "deleted 2 services") {
		t.Fatalf("teardown:\n%s", out)
	}
	t.Logf("teardown:\n%s", out)
	var after chaos.World
	if err := chaos.ObserveHost(runtimeDir, ids, &after); err != nil {
		t.Fatal(err)
	}
	if len(after.Processes) > 0 || len(after.Dirs) > 0 || len(after.Cgroups) > 0 {
		t.Errorf("after teardown: processes %+v, directories %v, cgroups %v", after.Processes, after.Dirs, after.Cgroups)
	}
	for _, p := range before.Processes {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(p.PID))); err == nil {
			if st, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.PID), "cmdline")); strings.Contains(string(st), runtimeDir) {
				t.Errorf("process %d (%s of %s) still runs", p.PID, p.Kind, p.ServiceID)
			}
		}
		for _, addr := range p.Listens {
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Errorf("%s (was %s of %s) still accepts connections", addr, p.Kind, p.ServiceID)
			}
		}
	}
	for _, u := range poolUsers {
		if _, err := user.Lookup(u); err == nil {
			t.Errorf("OS user %s of a prepared cluster is left after teardown", u)
		}
	}
	// The endpoints (served by proxy processes) are closed too.
	for _, port := range []int{a.Endpoint.Port, b.Endpoint.Port} {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second); err == nil {
			c.Close()
			t.Errorf("endpoint port %d still accepts connections", port)
		}
	}
	if _, err := os.Stat(runtimeDir); !os.IsNotExist(err) {
		t.Errorf("runtime directory %s: %v", runtimeDir, err)
	}
	s.start()
	var list []service
	if s.call("GET", s.services(), nil, &list); len(list) != 0 {
		t.Errorf("services after teardown: %+v", list)
	}
}
