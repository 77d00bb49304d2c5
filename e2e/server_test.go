// Package e2e tests dbcloud as users run it: the real binary, real
// PostgreSQL, clients over TLS. Servers are separate processes so that tests
// can kill them with SIGKILL at any moment.
package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"dbcloud"

	"dbcloud/internal/testports"
	"dbcloud/sqlite"

	"github.com/jackc/pgx/v5"
)

var binary string

func TestMain(m *testing.M) {
	if f := os.Getenv(minimalBodyEnv); f != "" {
		serveMinimal(f) // BenchmarkAPIBlackBox's minimal server
	}
	dir, err := os.MkdirTemp("", "dbcloud-e2e-bin-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "dbcloud")
	if out, err := exec.Command("go", "build", "-o", binary, "../cmd/dbcloud").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build dbcloud: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// portRange hands each server its own range of endpoint ports, which no
// other test on this machine holds, in this process or another checkout's.
func portRange(t testing.TB) (int, int) {
	t.Helper()
	lo := testports.MustBlock(t)
	return lo, lo + testports.BlockSize - 1
}

// apiPort is a server's API port: claimed for this process, and below the
// kernel's ephemeral range, since a restarted server binds it again and an
// ephemeral port left free meanwhile may be taken as the local end of any
// outgoing connection.
func apiPort(t testing.TB) int {
	t.Helper()
	return testports.MustPort(t)
}

// server is one dbcloud process over a data directory that outlives it.
type server struct {
	t      testing.TB
	dir    string
	listen string
	args   []string
	// env is added to the next start's environment.
	env []string
	// bin, if set, is the binary the next start runs instead of this
	// tree's (an older build, to compare with).
	bin    string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *os.File
	client *http.Client
	boot   struct {
		ProjectID string `json:"project_id"`
		AccessKey string `json:"access_key"`
		SecretKey string `json:"secret_key"`
		CAFile    string `json:"ca_file"`
	}
	baseURL string
	// runtime is where the server's instances live, when not
	// dir/runtime (a runtime directory shared by control planes).
	runtime string
}

// runtimeDir is where the server's instances live.
func (s *server) runtimeDir() string {
	localOnly(s.t, "reads the service's files on this host")
	if s.runtime != "" {
		return s.runtime
	}
	return filepath.Join(s.dir, "runtime")
}

// newServer makes a data directory that PostgreSQL's OS user can reach and
// starts dbcloud on it. Cleanup deletes what the test left and stops every
// process by its PID.
func newServer(t testing.TB, args ...string) *server {
	t.Helper()
	dir, err := os.MkdirTemp("", "dbcloud-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	return newServerIn(t, dir, args...)
}

// newServerIn is newServer on a data directory the test made (a
// filesystem of its own mounted there, say); cleanup unmounts what is
// mounted in it and removes it.
func newServerIn(t testing.TB, dir string, args ...string) *server {
	t.Helper()
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	lo, hi := portRange(t)
	s := &server{t: t, dir: dir, listen: "127.0.0.1:" + strconv.Itoa(apiPort(t)),
		args: append([]string{"--port-min", strconv.Itoa(lo), "--port-max", strconv.Itoa(hi),
			// Restore checks cost a scratch instance per service; the
			// tests of them turn them on.
			"--restore-check-interval", "0",
			// The default 25 GiB per GiB of memory is more than a test
			// machine's disk gives, and admission refuses a size whose
			// storage limit the disk cannot hold; the storage tests set
			// their own.
			"--storage-mib-per-memory-gib", "2048"}, args...)}
	t.Cleanup(func() {
		if s.cmd != nil && s.client != nil {
			s.deleteAll()
		}
		s.stop()
		stopPostmasters(t, dir)
		unmountUnder(t, dir)
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "server.log")); err == nil {
				var problems []string
				for _, l := range strings.Split(string(b), "\n") {
					if strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`) {
						problems = append(problems, l)
					}
				}
				t.Logf("server warnings and errors:\n%s", tail([]byte(strings.Join(problems, "\n")), 6000))
			}
		}
		os.RemoveAll(dir)
	})
	s.start()
	return s
}

// unmountUnder detaches every filesystem mounted at or below dir, the
// deepest first (a storage image dbcloud made with --storage-image-gib, a
// filesystem the test mounted), once the instances on them are stopped,
// so that removing dir removes everything.
func unmountUnder(t testing.TB, dir string) {
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(info), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if out, err := exec.Command("umount", p).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", p, err, out)
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (s *server) start() {
	s.t.Helper()
	requireRuntime(s.t)
	log, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	s.log = log
	args := append([]string{"serve", "--data-dir", s.dir, "--listen", s.listen, "--rate-limit", "0"}, s.args...)
	args = append(args, runtimeArgs(s.t, s.args)...)
	bin := binary
	if s.bin != "" {
		bin = s.bin
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = append(os.Environ(), s.env...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	// If the test process dies, its servers go too. (Postmasters outlive
	// dbcloud by design; Cleanup stops them by PID.)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(s.cmd, s.exited)
	deadline := time.Now().Add(60 * time.Second)
	for {
		raw, err := os.ReadFile(filepath.Join(s.dir, "bootstrap.json"))
		if err == nil && json.Unmarshal(raw, &s.boot) == nil && s.ready() {
			break
		}
		select {
		case <-s.exited:
			b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			s.cmd = nil
			s.t.Fatalf("dbcloud exited at start:\n%s", tail(b, 3000))
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			s.t.Fatalf("dbcloud did not start within 60 s (%v):\n%s", err, tail(b, 3000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ready reports whether the server answers /readyz over TLS.
func (s *server) ready() bool {
	if s.client == nil {
		pem, err := os.ReadFile(s.boot.CAFile)
		if err != nil {
			return false
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		s.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	s.baseURL = "https://" + s.listen + "/public/api/v1"
	res, err := s.client.Get("https://" + s.listen + "/readyz")
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == 200
}

// stop ends the server with SIGTERM, by its PID.
func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
	s.log.Close()
}

// kill ends the server with SIGKILL, by its PID: a crash.
func (s *server) kill() {
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
	s.log.Close()
}

func (s *server) restart() {
	s.t.Helper()
	s.stop()
	s.start()
}

// call sends a request and decodes a JSON answer into out when given.
func (s *server) call(method, path string, body any, out any) int {
	s.t.Helper()
	code, err := s.do(method, path, body, out)
	if err != nil {
		s.t.Fatal(err)
	}
	return code
}

// do is call without failing the test, for cleanup.
func (s *server) do(method, path string, body any, out any) (int, error) {
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.baseURL+path, r)
	req.SetBasicAuth(s.boot.AccessKey, s.boot.SecretKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := s.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return res.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, raw)
		}
	}
	return res.StatusCode, nil
}

func (s *server) services() string { return "/projects/" + s.boot.ProjectID + "/services" }

type service struct {
	ServiceID       string `json:"service_id"`
	Status          string `json:"status"`
	StatusReason    string `json:"status_reason"`
	InitialPassword string `json:"initial_password"`
	Endpoint        struct {
		Host string `json:"host"`
		Port int    `json:"port"`
	} `json:"endpoint"`
	Metrics *struct {
		MemoryMB  int64 `json:"memory_mb"`
		MilliCPU  int64 `json:"milli_cpu"`
		StorageMB int64 `json:"storage_mb"`
	} `json:"metrics"`
	Resources []struct {
		ID string `json:"id"`
	} `json:"resources"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (s *server) create(body map[string]any) service {
	s.t.Helper()
	var svc service
	if code := s.call("POST", s.services(), body, &svc); code != 202 {
		s.t.Fatalf("create: %d %+v", code, svc)
	}
	return svc
}

func (s *server) get(id string) (service, int) {
	s.t.Helper()
	var svc service
	code := s.call("GET", s.services()+"/"+id, nil, &svc)
	return svc, code
}

// waitStatus polls the service until it has status want.
func (s *server) waitStatus(id, want string, within time.Duration) service {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		svc, code := s.get(id)
		if code == 200 && svc.Status == want {
			return svc
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("service %s: want %s within %v, have %d %s (%s)", id, want, within, code, svc.Status, svc.StatusReason)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *server) waitGone(id string, within time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if _, code := s.get(id); code == 404 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("service %s still there after %v", id, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connect logs in as a user would: tsdbadmin over TLS verified against the CA.
func (s *server) connect(ctx context.Context, svc service, password string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, s.dsn(svc, password))
}

// dsn is the connection string connect uses.
func (s *server) dsn(svc service, password string) string {
	return fmt.Sprintf("postgresql://tsdbadmin:%s@%s:%d/tsdb?%s&connect_timeout=5",
		password, svc.Endpoint.Host, svc.Endpoint.Port, s.sslParams())
}

func (s *server) mustConnect(svc service, password string) *pgx.Conn {
	s.t.Helper()
	c, err := s.connect(context.Background(), svc, password)
	if err != nil {
		s.t.Fatalf("connect to %s: %v", svc.ServiceID, err)
	}
	s.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// postmasters lists the live postmasters serving a service's data directory,
// from the process table, so a duplicate start would show.
func (s *server) postmasters(id string) []int {
	localOnly(s.t, "reads postmasters from this host's process table")
	pgdata := filepath.Join(s.runtimeDir(), "services", id, "0", "pgdata")
	var pids []int
	candidates := map[int]int{} // pid -> parent pid
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 2 && strings.HasSuffix(args[0], "/postgres") && args[1] == "-D" && args[2] == pgdata {
			stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			i := bytes.LastIndexByte(stat, ')')
			if i < 0 || len(stat) < i+2 || stat[i+2] == 'Z' {
				continue
			}
			fields := strings.Fields(string(stat[i+2:]))
			ppid, _ := strconv.Atoi(fields[1])
			candidates[pid] = ppid
		}
	}
	// A child the postmaster has just forked carries its command line for a
	// moment; only a process whose parent is not one of them is a postmaster.
	for pid, ppid := range candidates {
		if _, child := candidates[ppid]; !child {
			pids = append(pids, pid)
		}
	}
	return pids
}

// deleteAll deletes every service through the API, as a user would, so
// their processes, files and cgroups go.
func (s *server) deleteAll() {
	var list []service
	if code, err := s.do("GET", s.services(), nil, &list); err != nil || code != 200 {
		return
	}
	for _, svc := range list {
		// DEV, needed for delete, is refused while read replica sets, the
		// pooler or HA replicas are on.
		var sets []struct {
			ID string `json:"id"`
		}
		s.do("GET", s.services()+"/"+svc.ServiceID+"/replicaSets", nil, &sets)
		for _, r := range sets {
			s.do("DELETE", s.services()+"/"+svc.ServiceID+"/replicaSets/"+r.ID, nil, nil)
		}
		for deadline := time.Now().Add(30 * time.Second); len(sets) > 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			sets = nil
			s.do("GET", s.services()+"/"+svc.ServiceID+"/replicaSets", nil, &sets)
		}
		s.do("POST", s.services()+"/"+svc.ServiceID+"/disablePooler", nil, nil)
		s.settle(svc.ServiceID)
		s.do("POST", s.services()+"/"+svc.ServiceID+"/setHA", map[string]int{"replica_count": 0, "sync_replica_count": 0}, nil)
		s.settle(svc.ServiceID)
		s.do("POST", s.services()+"/"+svc.ServiceID+"/setEnvironment", map[string]string{"environment": "DEV"}, nil)
		s.do("DELETE", s.services()+"/"+svc.ServiceID, nil, nil)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, svc := range list {
		for time.Now().Before(deadline) {
			if code, err := s.do("GET", s.services()+"/"+svc.ServiceID, nil, nil); err != nil || code == 404 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// settle waits up to 60 s for a service to end its operation in flight,
// for cleanups that go on whatever the outcome.
func (s *server) settle(id string) {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var svc service
		if code, err := s.do("GET", s.services()+"/"+id, nil, &svc); err != nil || code != 200 ||
			svc.Status == "READY" || svc.Status == "PAUSED" || svc.Status == "UNSTABLE" {
			return
		}
	}
}

// stopPostmasters stops, by PID, every postmaster and pooler a test left
// running under dir (they outlive dbcloud by design), and removes the
// cgroups of their instances once empty.
func stopPostmasters(t testing.TB, dir string) {
	defer removeCgroups(dir)
	pidFiles, _ := filepath.Glob(filepath.Join(dir, "runtime", "services", "*", "pooler", "*.pid"))
	proxies, _ := filepath.Glob(filepath.Join(dir, "runtime", "services", "*", "proxy", "proxy.pid"))
	for _, f := range append(pidFiles, proxies...) {
		stopByPIDFile(f)
	}
	pidFiles, _ = filepath.Glob(filepath.Join(dir, "runtime", "services", "*", "*", "pgdata", "postmaster.pid"))
	// Restore checks' scratch instances, when a test ends during one.
	scratch, _ := filepath.Glob(filepath.Join(dir, "runtime", "scratch", "*", "pgdata", "postmaster.pid"))
	for _, f := range append(pidFiles, scratch...) {
		stopByPIDFile(f)
	}
	// The OS users of services the test did not delete: dbc-<id>, or the
	// one the service took with its cluster from the pool, recorded in
	// identities/<id>; and those of the pool's entries, dbc-p-<entry>.
	var users []string
	svcs, _ := os.ReadDir(filepath.Join(dir, "runtime", "services"))
	for _, svc := range svcs {
		users = append(users, "dbc-"+svc.Name())
	}
	records, _ := filepath.Glob(filepath.Join(dir, "runtime", "identities", "*"))
	claims, _ := filepath.Glob(filepath.Join(dir, "runtime", "services", "*", "claimed", "identity"))
	records = append(records, claims...)
	for _, f := range records {
		if key, err := os.ReadFile(f); err == nil {
			users = append(users, "dbc-"+strings.TrimSpace(string(key)))
		}
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "runtime", "pool"))
	for _, e := range entries {
		for _, prefix := range []string{".tmp-gone-", ".tmp-", "ready-"} {
			if name, ok := strings.CutPrefix(e.Name(), prefix); ok {
				users = append(users, "dbc-p-"+name)
				break
			}
		}
	}
	for _, u := range users {
		exec.Command("userdel", u).Run()
		exec.Command("groupdel", u).Run()
	}
}

// stopByPIDFile stops the process whose PID is the file's first line.
func stopByPIDFile(f string) {
	raw, err := os.ReadFile(f)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	if err != nil || pid <= 1 {
		return
	}
	syscall.Kill(pid, syscall.SIGQUIT)
	for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

// removeCgroups removes the empty cgroups of the services under dir.
func removeCgroups(dir string) {
	svcs, _ := os.ReadDir(filepath.Join(dir, "runtime", "services"))
	for _, s := range svcs {
		for _, c := range []string{"cpu", "cpuacct", "memory", "pids"} {
			groups, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", c, "dbcloud", s.Name()+"-*"))
			for _, g := range groups {
				for i := 0; i < 50 && os.Remove(g) != nil; i++ {
					time.Sleep(20 * time.Millisecond) // processes still leaving
				}
			}
		}
	}
}

// waitMeasured waits until the engine has measured the service after t
// (read from the store, as the engine wrote it): its health and metrics
// loops have looked at the service since then.
func (s *server) waitMeasured(id string, after time.Time, within time.Duration) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	st, err := sqlite.Open(ctx, filepath.Join(s.dir, "dbcloud.db"))
	if err != nil {
		s.t.Fatalf("open the store: %v", err)
	}
	defer st.Close()
	for {
		var measured time.Time
		err := st.View(ctx, func(tx dbcloud.Tx) error {
			svc, err := tx.FindService(s.boot.ProjectID, id)
			if err == nil && svc.Metrics != nil {
				measured = svc.Metrics.Measured
			}
			return err
		})
		if err == nil && measured.After(after) {
			return
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("service %s not measured after %v within %v (last %v, %v)", id, after, within, measured, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logOffset is where the server's log ends now: logLines after it shows
// only what the server wrote since.
func (s *server) logOffset() int64 {
	fi, err := os.Stat(filepath.Join(s.dir, "server.log"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logLines returns the server's structured log lines written after
// offset whose message is msg and whose service is id.
func (s *server) logLines(offset int64, msg, id string) []map[string]any {
	raw, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if int64(len(raw)) < offset {
		offset = 0
	}
	var out []map[string]any
	for _, line := range bytes.Split(raw[offset:], []byte("\n")) {
		var entry map[string]any
		if json.Unmarshal(line, &entry) == nil && entry["msg"] == msg && entry["service"] == id {
			out = append(out, entry)
		}
	}
	return out
}

// waitUnhealthy waits for the engine's log line that it showed the
// service UNSTABLE (written after the status change committed), after
// offset, and returns the reason it gave: the event itself, however
// briefly the API showed the status before the repair.
func (s *server) waitUnhealthy(id string, offset int64, within time.Duration) string {
	s.t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		if lines := s.logLines(offset, "service unhealthy", id); len(lines) > 0 {
			reason, _ := lines[0]["reason"].(string)
			return reason
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("service %s not shown UNSTABLE within %v (no \"service unhealthy\" line in the log)", id, within)
		}
	}
}
