package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pgBin holds the PostgreSQL client the tenant's shell uses.
const pgBin = "/usr/lib/postgresql/15/bin"

// TestGuard_OSIsolation is issue 13's escape matrix at the OS level, on the
// real binary: service A (with its pooler and a read replica set) in one
// project, service B in another. A tenant who got a shell through A's
// database is A's OS user, so every row runs a command as A's uid and gid
// (setpriv, no supplementary groups): B's data directory, configuration,
// keys, logs, archive and sockets, and dbcloud's own data directory, must
// be out of reach, and A's own socket must not make it a superuser. A
// ps-style check reads the Uid of every process of each service: none is
// root or shared, each has its service's uid. Deleting B removes its OS
// user.
func TestGuard_OSIsolation(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("switching to a service's OS user needs root")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv is not installed")
	}
	var dir string
	t.Cleanup(func() {
		if dir != "" {
			stopPoolers(dir)
		}
	})
	s := newServer(t)
	dir = s.dir
	projB := s.newProject("tenant-b")
	createdA := s.create(map[string]any{"name": "iso-a", "cpu_millis": "shared"})
	var createdB service
	if code, err := s.doAs(projB, "POST", "/projects/"+projB.ProjectID+"/services", map[string]any{"name": "iso-b", "cpu_millis": "shared"}, &createdB); err != nil || code != 202 {
		t.Fatalf("create B in its project: %d %v", code, err)
	}
	bPath := "/projects/" + projB.ProjectID + "/services/" + createdB.ServiceID
	t.Cleanup(func() { s.doAs(projB, "DELETE", bPath, nil, nil) })
	a := s.waitStatus(createdA.ServiceID, "READY", 90*time.Second)
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var b service
		if code, _ := s.doAs(projB, "GET", bPath, nil, &b); code == 200 && b.Status == "READY" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B not READY")
		}
	}
	if code := s.call("POST", s.services()+"/"+a.ServiceID+"/enablePooler", nil, nil); code != 200 {
		t.Fatalf("enablePooler: %d", code)
	}
	s.waitPooler(a.ServiceID, true, 60*time.Second)
	var rs replicaSet
	if code := s.call("POST", s.replicaSets(a.ServiceID), map[string]any{"name": "reads", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}, &rs); code != 202 {
		t.Fatalf("create replica set: %d %+v", code, rs)
	}
	s.waitReplicaSet(a.ServiceID, rs.ID, "active", 120*time.Second)

	services := filepath.Join(dir, "runtime", "services")
	aDir, bDir := filepath.Join(services, a.ServiceID), filepath.Join(services, createdB.ServiceID)

	// ps: every process of each service, by the directory its command
	// line names and everything those processes forked.
	procsA := serviceProcesses(aDir, filepath.Join(services, rs.ID))
	procsB := serviceProcesses(bDir)
	kinds := map[string]bool{}
	for _, p := range procsA {
		kinds[p.kind] = true
	}
	for _, k := range []string{"postgres", "pgbouncer", "proxy"} {
		if !kinds[k] {
			t.Errorf("no %s process of service A found among %v", k, procsA)
		}
	}
	if len(procsB) == 0 {
		t.Fatal("no process of service B found")
	}
	// Each service's uid is its primary postmaster's: a tenant's shell
	// through COPY ... PROGRAM runs as a backend of it.
	primaryOf := func(procs []osProc, dir string) osProc {
		pid := svcPID(t, dir)
		for _, p := range procs {
			if p.pid == pid {
				return p
			}
		}
		t.Fatalf("postmaster %d of %s not among its processes %v", pid, dir, procs)
		return osProc{}
	}
	pmA := primaryOf(procsA, aDir)
	uidA, gidA := pmA.uid, pmA.gid
	pmB := primaryOf(procsB, bDir)
	uidB, gidB := pmB.uid, pmB.gid
	t.Logf("A runs as uid %d, B as uid %d; processes of A: %v", uidA, uidB, procsA)
	t.Run("ProcessesRunAsTheirServiceAlone", func(t *testing.T) {
		for _, set := range []struct {
			name  string
			procs []osProc
			uid   uint32
		}{{"A", procsA, uidA}, {"B", procsB, uidB}} {
			for _, p := range set.procs {
				if p.uid == 0 {
					t.Errorf("service %s: %s process %d runs as root: %s", set.name, p.kind, p.pid, p.cmd)
				}
				if p.uid != set.uid {
					t.Errorf("service %s: %s process %d runs as uid %d, its service's others as %d: %s", set.name, p.kind, p.pid, p.uid, set.uid, p.cmd)
				}
			}
		}
		if uidA == uidB {
			t.Errorf("services A and B share OS uid %d", uidA)
		}
	})

	// asA runs a command as A's OS user, as a tenant's shell would.
	asA := func(args ...string) (string, error) {
		cmd := exec.Command("setpriv", append([]string{"--reuid=" + strconv.Itoa(int(uidA)), "--regid=" + strconv.Itoa(int(gidA)),
			"--clear-groups", "--"}, args...)...)
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C", "PGCONNECT_TIMEOUT=5"}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	// The simulation reaches what A owns: without this every refusal below
	// could be a broken setpriv.
	if out, err := asA("ls", filepath.Join(aDir, "0", "pgdata")); err != nil || !strings.Contains(out, "PG_VERSION") {
		t.Fatalf("as A's OS user, A's own data directory: %v %s", err, out)
	}

	t.Run("OtherServiceUnreachable", func(t *testing.T) {
		for _, row := range []struct{ name, path string }{
			{"B's service directory", bDir},
			{"B's data directory", filepath.Join(bDir, "0", "pgdata")},
			{"B's PG_VERSION", filepath.Join(bDir, "0", "pgdata", "PG_VERSION")},
			{"B's config", filepath.Join(bDir, "0", "conf", "pg_hba.conf")},
			{"B's server key", filepath.Join(bDir, "0", "conf", "server.key")},
			{"B's certificate store", filepath.Join(bDir, "tls", "server.key")},
			{"B's logs", filepath.Join(bDir, "0", "log")},
			{"B's WAL archive", filepath.Join(bDir, "archive")},
			{"B's socket directory", filepath.Join(bDir, "0", "run")},
		} {
			cmd := "cat"
			if fi, err := os.Stat(row.path); err == nil && fi.IsDir() {
				cmd = "ls"
			} else if err != nil {
				t.Errorf("%s: %s does not exist (%v): the row proves nothing", row.name, row.path, err)
				continue
			}
			if out, err := asA(cmd, row.path); err == nil {
				t.Errorf("%s: A's OS user read %s (%d bytes)", row.name, row.path, len(out))
			}
		}
		for _, user := range []string{"postgres", "tsdbadmin", "dbcloud_replicator"} {
			if out, err := asA(filepath.Join(pgBin, "psql"), "-h", filepath.Join(bDir, "0", "run"), "-p", strconv.Itoa(svcPort(t, bDir)),
				"-U", user, "-d", "postgres", "-w", "-Atc", "SELECT 1"); err == nil {
				t.Errorf("B's socket let A's OS user in as %s: %s", user, out)
			}
		}
	})

	t.Run("DbcloudDataUnreadable", func(t *testing.T) {
		if out, err := asA("ls", dir); err == nil {
			t.Errorf("A's OS user listed dbcloud's data directory: %s", out)
		}
		entries, _ := os.ReadDir(dir)
		checked := 0
		for _, e := range entries {
			if !e.Type().IsRegular() || e.Name() == "server.log" {
				continue
			}
			checked++
			if out, err := asA("cat", filepath.Join(dir, e.Name())); err == nil {
				t.Errorf("A's OS user read dbcloud's %s (%d bytes)", e.Name(), len(out))
			}
		}
		if checked == 0 {
			t.Error("no file of dbcloud's own found to try")
		}
		if out, err := asA("ls", filepath.Join(dir, "runtime", "pool")); err == nil {
			t.Errorf("A's OS user listed the pool of prepared clusters: %s", out)
		}
	})

	t.Run("OwnSocketNoSuperuser", func(t *testing.T) {
		sock, port := filepath.Join(aDir, "0", "run"), strconv.Itoa(svcPort(t, aDir))
		if out, err := asA(filepath.Join(pgBin, "psql"), "-h", sock, "-p", port, "-U", "postgres", "-d", "postgres", "-w", "-Atc", "SELECT 1"); err == nil {
			t.Errorf("A's OS user became the superuser of its own service: %s", out)
		}
		// The roles its own processes enter as are not superusers.
		for _, user := range []string{"dbcloud_pooler", "dbcloud_replicator"} {
			out, err := asA(filepath.Join(pgBin, "psql"), "-h", sock, "-p", port, "-U", user, "-d", "postgres", "-w", "-Atc",
				"SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
			if err == nil && out != "f" {
				t.Errorf("as %s over A's own socket: superuser %q", user, out)
			}
		}
		// Nor can it rewrite who may log in.
		if out, err := asA("sh", "-c", "echo 'local all all trust' >> "+filepath.Join(aDir, "0", "conf", "pg_hba.conf")); err == nil {
			t.Errorf("A's OS user changed its pg_hba.conf: %s", out)
		}
	})

	t.Run("DeleteRemovesOSUser", func(t *testing.T) {
		if code, err := s.doAs(projB, "DELETE", bPath, nil, nil); err != nil || code != 202 {
			t.Fatalf("delete B: %d %v", code, err)
		}
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if code, _ := s.doAs(projB, "GET", bPath, nil, nil); code == 404 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("B not deleted")
			}
		}
		passwd, _ := os.ReadFile("/etc/passwd")
		group, _ := os.ReadFile("/etc/group")
		for _, db := range []struct {
			name string
			data []byte
			id   uint32
		}{{"passwd", passwd, uidB}, {"group", group, gidB}} {
			for _, line := range strings.Split(string(db.data), "\n") {
				if f := strings.Split(line, ":"); len(f) > 2 && (f[2] == strconv.Itoa(int(db.id)) || strings.Contains(f[0], createdB.ServiceID)) {
					t.Errorf("/etc/%s still has B's entry: %s", db.name, line)
				}
			}
		}
	})
}

// osProc is one process of a service as ps would show it.
type osProc struct {
	pid      int
	uid, gid uint32
	kind     string // postgres, pgbouncer, proxy
	cmd      string
}

func (p osProc) String() string { return fmt.Sprintf("%d/%s/uid %d", p.pid, p.kind, p.uid) }

// serviceProcesses finds the processes whose command line names a path
// under one of dirs (postmasters, PgBouncer, endpoint proxies: `dbcloud __endpoint-proxy DIR`) and every
// process they forked (backends, workers), from /proc.
func serviceProcesses(dirs ...string) []osProc {
	type entry struct {
		ppid int
		p    osProc
	}
	all := map[int]entry{}
	ds, _ := os.ReadDir("/proc")
	for _, d := range ds {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", d.Name(), "status"))
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		e := entry{p: osProc{pid: pid, cmd: strings.ReplaceAll(string(cmdline), "\x00", " ")}}
		for _, line := range strings.Split(string(status), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) > 1 && f[0] == "PPid:":
				e.ppid, _ = strconv.Atoi(f[1])
			case len(f) > 1 && f[0] == "Uid:":
				u, _ := strconv.ParseUint(f[1], 10, 32)
				e.p.uid = uint32(u)
			case len(f) > 1 && f[0] == "Gid:":
				g, _ := strconv.ParseUint(f[1], 10, 32)
				e.p.gid = uint32(g)
			}
		}
		all[pid] = e
	}
	roots := map[int]string{}
	for pid, e := range all {
		for _, d := range dirs {
			if !strings.Contains(e.p.cmd, d+"/") {
				continue
			}
			switch {
			case strings.Contains(e.p.cmd, "pgbouncer"):
				roots[pid] = "pgbouncer"
			case strings.Contains(e.p.cmd, "endpoint-proxy "):
				roots[pid] = "proxy"
			case strings.Contains(e.p.cmd, "postgres"):
				roots[pid] = "postgres"
			}
		}
	}
	var out []osProc
	for pid, e := range all {
		for p := pid; p > 1; p = all[p].ppid {
			if kind, ok := roots[p]; ok {
				e.p.kind = kind
				out = append(out, e.p)
				break
			}
			if _, ok := all[p]; !ok {
				break
			}
		}
	}
	return out
}

// svcPort reads the port of instance 0 of the service in dir from its
// postmaster.pid (4th line).
func svcPort(t *testing.T, dir string) int { return pidFileLine(t, dir, 3) }

// svcPID reads the PID of instance 0's postmaster (1st line).
func svcPID(t *testing.T, dir string) int { return pidFileLine(t, dir, 0) }

func pidFileLine(t *testing.T, dir string, n int) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "0", "pgdata", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	if len(lines) <= n {
		t.Fatalf("postmaster.pid: %q", raw)
	}
	v, err := strconv.Atoi(strings.TrimSpace(lines[n]))
	if err != nil {
		t.Fatal(err)
	}
	return v
}
