package local

// The connection pooler: one PgBouncer per service (runtime-notes.md
// section 8), in transaction mode, on its own port of the endpoint host,
// with TLS and the service's certificate. Clients sign in with SCRAM
// against the service's own role verifiers, which PgBouncer reads through a
// lookup function (auth_query); it then logs in to PostgreSQL as the client
// over the instance's unix socket by SCRAM pass-through, so PostgreSQL
// checks the real credentials a second time and a password change works at
// once. PgBouncer's own lookup role logs in by peer identity over that
// socket: no secret is stored anywhere.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"dbcloud"
)

// poolerRole is the role PgBouncer runs auth_query as. It has no password:
// pg_hba.conf lets it in only by peer identity over the unix socket, which
// only the server's OS user (PgBouncer's) can reach, and PgBouncer's own
// HBA refuses it (and the superuser) to clients.
const poolerRole = "dbcloud_pooler"

const (
	// poolerMaxClientConn is how many client connections one pooler takes;
	// server connections stay under the service's max_connections.
	poolerMaxClientConn = 2000
	// poolerNoFile is the open-file limit PgBouncer gets (clients, server
	// connections, listeners), capped by the hard limit.
	poolerNoFile = 8192
	// poolerMemoryBytes caps the pooler's cgroup: PgBouncer needs a few MB
	// plus buffers for busy connections.
	poolerMemoryBytes = 256 << 20
	// poolerReadyTimeout bounds a start until the port serves TLS.
	poolerReadyTimeout = 15 * time.Second
	// poolerStopTimeout bounds a stop: a safe shutdown (SIGINT) lets
	// running transactions finish, then SIGTERM, then SIGKILL.
	poolerStopTimeout = 10 * time.Second
	// poolerAuthVersion names the lookup function's definition; a change
	// re-installs it in every database.
	poolerAuthVersion = "1"
	// superuserReserved is PostgreSQL's superuser_reserved_connections,
	// which dbcloud leaves at its default.
	superuserReserved = 3
)

// Files in a service's pooler directory, DATA/services/<id>/pooler.
const (
	poolerIniFile    = "pgbouncer.ini"
	poolerHBAFile    = "pg_hba.conf"
	poolerUsersFile  = "userlist.txt"
	poolerCertFile   = "server.crt"
	poolerKeyFile    = "server.key"
	poolerPidFile    = "pgbouncer.pid"
	poolerLogFile    = "pgbouncer.log"
	poolerAuthMarker = "lookup-installed"
)

// poolerSpec says everything about one pooler.
type poolerSpec struct {
	// ID names the cgroup: "<service>-pooler".
	ID string
	// Dir holds the config, TLS files, pid file and log (absolute).
	Dir        string
	ListenAddr string
	Port       int
	// Target is the instance pooled: its unix socket directory and port.
	Target InstanceSpec
}

func (p poolerSpec) path(name string) string { return filepath.Join(p.Dir, name) }

func (rt *Runtime) poolerDir(serviceID string) string {
	return filepath.Join(rt.serviceDir(serviceID), "pooler")
}

// pgbouncerBinary finds PgBouncer: Debian's /usr/sbin/pgbouncer, else PATH.
var pgbouncerBinary = sync.OnceValues(func() (string, error) {
	const debian = "/usr/sbin/pgbouncer"
	if fi, err := os.Stat(debian); err == nil && fi.Mode().IsRegular() {
		return debian, nil
	}
	return exec.LookPath("pgbouncer")
})

// PoolerAvailable reports whether PgBouncer is installed, for a domain that
// wants to refuse enablePooler up front.
func PoolerAvailable() bool {
	_, err := pgbouncerBinary()
	return err == nil
}

// ensurePooler makes the service's pooler match its spec. With the pooler
// enabled and the service running, it writes the pooler's files, installs
// the lookup role and function, starts PgBouncer (or adopts the one already
// running, reloading it when its config changed) and returns the endpoint
// once it serves TLS there. Otherwise it stops and removes the pooler and
// returns nil. target is the instance pooled and source the primary where
// the lookup role and function are installed (the same instance for a
// service; a read replica set's pooler pools a standby, which gets them by
// replication). port is the pooler's claimed port.
func (rt *Runtime) ensurePooler(ctx context.Context, svc *dbcloud.Service, target, source InstanceSpec, port int) (*dbcloud.Endpoint, error) {
	if !svc.Spec.Pooler || !svc.Spec.Running {
		return nil, rt.stopPooler(ctx, svc.ID)
	}
	if svc.Endpoint == nil {
		return nil, dbcloud.Terminal(fmt.Errorf("service %s has no endpoint", svc.ID))
	}
	if port < 1 || port > 65535 {
		return nil, dbcloud.Terminal(fmt.Errorf("service %s has no pooler port (%d)", svc.ID, port))
	}
	bin, err := pgbouncerBinary()
	if rt.cfg.PgBouncer != "" {
		bin, err = exec.LookPath(rt.cfg.PgBouncer)
	}
	if err != nil {
		return nil, dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindUnavailable,
			"The connection pooler (PgBouncer) is not installed on this server; disable the pooler or ask the operator to install it."))
	}
	p := poolerSpec{
		ID: svc.ID + "-pooler", Dir: rt.poolerDir(svc.ID),
		ListenAddr: rt.listenAddr(), Port: port, Target: target,
	}
	if err := p.validate(); err != nil {
		return nil, dbcloud.Terminal(fmt.Errorf("pooler of %s: %w", svc.ID, err))
	}
	defer rt.mgr.lock(p.Dir)()
	if err := rt.ensurePoolerAuth(ctx, p, source); err != nil {
		return nil, fmt.Errorf("pooler of %s: %w", svc.ID, err)
	}
	pid, err := rt.runPooler(ctx, bin, p)
	if err != nil {
		return nil, fmt.Errorf("pooler of %s: %w", svc.ID, err)
	}
	ep := &dbcloud.Endpoint{Host: svc.Endpoint.Host, Port: port}
	if err := rt.waitPooler(ctx, p, pid, ep); err != nil {
		return nil, fmt.Errorf("pooler of %s: %w", svc.ID, err)
	}
	return ep, nil
}

// poolerRunning reports whether the service's pooler process is alive, for
// health checks.
func (rt *Runtime) poolerRunning(serviceID string) bool {
	_, ok := rt.runningPooler(poolerSpec{Dir: rt.poolerDir(serviceID)})
	return ok
}

// stopPooler stops the service's PgBouncer by PID (a safe shutdown, then
// harder) and removes its files and cgroup. It is idempotent.
func (rt *Runtime) stopPooler(ctx context.Context, serviceID string) error {
	p := poolerSpec{ID: serviceID + "-pooler", Dir: rt.poolerDir(serviceID)}
	m := rt.mgr
	cg := m.cgroupOf(p.ID)
	if cg != nil && !cg.exists() {
		cg = nil
	}
	if _, err := os.Lstat(p.Dir); errors.Is(err, fs.ErrNotExist) && cg == nil {
		return nil // nothing was ever started, or it is gone already
	}
	defer m.lock(p.Dir)()
	if err := rt.killPooler(ctx, p, cg); err != nil {
		return fmt.Errorf("stop pooler of %s: %w", serviceID, err)
	}
	if cg != nil {
		if err := cg.remove(time.Now().Add(5 * time.Second)); err != nil {
			return fmt.Errorf("stop pooler of %s: %w", serviceID, err)
		}
	}
	if err := os.RemoveAll(p.Dir); err != nil {
		return fmt.Errorf("stop pooler of %s: %w", serviceID, err)
	}
	return nil
}

func (p poolerSpec) validate() error {
	// PgBouncer's ini and connection-string syntax has no quoting for these.
	for _, v := range []string{p.Dir, p.Target.runDir(), p.ListenAddr} {
		if v == "" || strings.ContainsAny(v, " \t\r\n'\"\\;#=") {
			return fmt.Errorf("%q cannot appear in a PgBouncer config", v)
		}
	}
	switch {
	case !filepath.IsAbs(p.Dir) || filepath.Clean(p.Dir) != p.Dir:
		return fmt.Errorf("pooler dir %q must be a clean absolute path", p.Dir)
	case !instanceID.MatchString(p.ID):
		return fmt.Errorf("pooler id %q is not a valid id", p.ID)
	case p.Target.Port < 1 || p.Target.Port > 65535:
		return fmt.Errorf("target port %d out of range", p.Target.Port)
	case len(p.Target.CertPEM) == 0 || len(p.Target.KeyPEM) == 0:
		return errors.New("a TLS certificate and key are required")
	}
	return nil
}

// poolSize is how many server connections the pooler may open per pool
// (and per database and per user): three quarters of what max_connections
// leaves beyond the superuser's reserve, so direct clients on the service
// endpoint and maintenance keep room.
func poolSize(settings map[string]string) int {
	maxConns := 100
	if v, err := strconv.Atoi(settings["max_connections"]); err == nil && v > 0 {
		maxConns = v
	}
	return max(1, (maxConns-superuserReserved)*3/4)
}

// renderPoolerConfig returns pgbouncer.ini and PgBouncer's HBA file. It is
// a pure function of the spec, so an unchanged spec leaves the files
// byte-equal and PgBouncer untouched. The first line signs what only a
// restart applies (listen address and port, pid file, TLS key pair).
func renderPoolerConfig(p poolerSpec) (ini, hba []byte) {
	size := poolSize(p.Target.Settings)
	var b bytes.Buffer
	fmt.Fprintf(&b, "; restart signature: %s\n", poolerRestartSignature(p))
	fmt.Fprintf(&b, "; Written by dbcloud for pooler %s; rewritten on every change, do not edit.\n", p.ID)
	b.WriteString("[databases]\n")
	// Every database of the service, over the instance's unix socket. The
	// lookup role is set here, not globally, so that the admin console
	// (which has no server to ask) refuses at once instead of hanging.
	fmt.Fprintf(&b, "* = host=%s port=%d auth_user=%s\n", p.Target.runDir(), p.Target.Port, poolerRole)
	b.WriteString("\n[pgbouncer]\n")
	set := func(k, v string) { fmt.Fprintf(&b, "%s = %s\n", k, v) }
	set("listen_addr", p.ListenAddr)
	set("listen_port", strconv.Itoa(p.Port))
	set("listen_backlog", "1024")
	set("unix_socket_dir", "") // no client socket: TCP with TLS only
	set("pidfile", p.path(poolerPidFile))
	set("pool_mode", "transaction")
	set("max_client_conn", strconv.Itoa(poolerMaxClientConn))
	set("default_pool_size", strconv.Itoa(size))
	set("max_db_connections", strconv.Itoa(size))
	set("max_user_connections", strconv.Itoa(size))
	set("reserve_pool_size", "0")
	set("auth_type", "hba")
	set("auth_hba_file", p.path(poolerHBAFile))
	set("auth_file", p.path(poolerUsersFile))
	set("auth_query", "SELECT usename, passwd FROM pgbouncer.get_auth($1)")
	set("client_tls_sslmode", "require")
	set("client_tls_cert_file", p.path(poolerCertFile))
	set("client_tls_key_file", p.path(poolerKeyFile))
	set("client_tls_protocols", "secure")
	set("server_tls_sslmode", "disable") // unix socket
	// A failed server login (the primary restarting) refuses new clients
	// for this long; the default 15 s outlasts a restart by far.
	set("server_login_retry", "1")
	set("ignore_startup_parameters", "extra_float_digits")
	set("log_connections", "0")
	set("log_disconnections", "0")
	set("log_stats", "0")
	set("admin_users", "")
	set("stats_users", "")

	// The superuser and the lookup role log in to PostgreSQL by peer
	// identity over the socket, which PgBouncer's OS user passes: no client
	// may ever make PgBouncer open such a connection, whatever a lookup
	// function (the one in a database a client owns, say) answers. Neither
	// may anyone reach the admin console.
	var h bytes.Buffer
	h.WriteString("# Written by dbcloud; rewritten on every change, do not edit.\n")
	for _, cidr := range []string{"0.0.0.0/0", "::/0"} {
		fmt.Fprintf(&h, "hostssl  pgbouncer  all  %s  reject\n", cidr)
		fmt.Fprintf(&h, "hostssl  all  postgres,%s  %s  reject\n", poolerRole, cidr)
	}
	for _, cidr := range []string{"0.0.0.0/0", "::/0"} {
		fmt.Fprintf(&h, "hostssl  all  all  %s  scram-sha-256\n", cidr)
	}
	return b.Bytes(), h.Bytes()
}

// poolerRestartSignature hashes what PgBouncer reads only at startup.
func poolerRestartSignature(p poolerSpec) string {
	h := sha256.New()
	for _, v := range []string{p.ListenAddr, strconv.Itoa(p.Port), p.path(poolerPidFile),
		strconv.Itoa(poolerNoFile), string(p.Target.CertPEM), string(p.Target.KeyPEM)} {
		fmt.Fprintf(h, "%d:%s;", len(v), v)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func restartSignature(ini []byte) string {
	first, _, _ := bytes.Cut(ini, []byte("\n"))
	sig, ok := bytes.CutPrefix(first, []byte("; restart signature: "))
	if !ok {
		return ""
	}
	return string(sig)
}

// runPooler writes the pooler's files and makes PgBouncer run with them: it
// adopts a running one (reloading it when the config changed, restarting
// it when a startup-only setting did) or starts one. It returns the PID.
func (rt *Runtime) runPooler(ctx context.Context, bin string, p poolerSpec) (int, error) {
	m := rt.mgr
	if err := m.makeServerDir(p.Dir); err != nil {
		return 0, err
	}
	ini, hba := renderPoolerConfig(p)
	old, _ := os.ReadFile(p.path(poolerIniFile))
	changed := !bytes.Equal(old, ini)
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{poolerCertFile, p.Target.CertPEM, 0o644},
		{poolerKeyFile, p.Target.KeyPEM, 0o600},
		{poolerHBAFile, hba, 0o600},
		// No secret: the lookup role signs in by peer, clients by
		// auth_query. PgBouncer still wants the file to exist.
		{poolerUsersFile, nil, 0o600},
		{poolerIniFile, ini, 0o600},
	} {
		if err := m.writeFileAtomic(p.path(f.name), f.data, f.perm); err != nil {
			return 0, err
		}
	}
	if err := syncDir(p.Dir); err != nil {
		return 0, err
	}
	if err := rotatePoolerLog(p.path(poolerLogFile)); err != nil {
		m.Logger.Warn("rotate pooler log", "pooler", p.ID, "error", err)
	}
	cg := m.ensureCgroup(p.ID)
	if cg != nil {
		if err := cg.setLimits(0, poolerMemoryBytes); err != nil {
			return 0, fmt.Errorf("set pooler limits: %w", err)
		}
	}
	if pid, ok := rt.runningPooler(p); ok {
		if cg != nil && !cg.contains(pid, m.cgroupMounts) {
			if err := cg.add(pid); err != nil {
				m.Logger.Warn("move pooler into its cgroup", "pooler", p.ID, "pid", pid, "error", err)
			}
		}
		switch {
		case !changed:
			m.Logger.Debug("pooler adopted", "pooler", p.ID, "pid", pid)
			return pid, nil
		case restartSignature(old) == restartSignature(ini):
			if err := rt.reloadPooler(ctx, p, pid); err != nil {
				return 0, err
			}
			return pid, nil
		}
		m.Logger.Info("restarting pooler for new startup settings", "pooler", p.ID, "pid", pid)
	}
	// Whatever still runs with this config (the one to restart, or one a
	// crash left without its pid file) goes first: it holds the port.
	if err := rt.killPooler(ctx, p, cg); err != nil {
		return 0, err
	}
	return rt.spawnPooler(bin, p, cg)
}

// reloadPooler makes PgBouncer re-read its config (SIGHUP) and waits until
// its log shows it did.
func (rt *Runtime) reloadPooler(ctx context.Context, p poolerSpec, pid int) error {
	logPath := p.path(poolerLogFile)
	var offset int64
	if fi, err := os.Stat(logPath); err == nil {
		offset = fi.Size()
	}
	begin := time.Now()
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("signal pooler %d: %w", pid, err)
	}
	ctx, cancel := context.WithTimeout(ctx, reloadTimeout)
	defer cancel()
	for {
		if data := readFrom(logPath, offset); bytes.Contains(bytes.ToLower(data), []byte("sighup")) {
			rt.mgr.Logger.Info("pooler reloaded", "pooler", p.ID, "pid", pid, "ms", time.Since(begin).Milliseconds())
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pooler %d did not reload: %w", pid, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// poolerLogMax is the size at which the pooler's log is rotated (checked
// at every ensure), keeping one older generation.
const poolerLogMax = 16 << 20

// rotatePoolerLog copies a log grown past poolerLogMax to <log>.1 and
// empties it in place: PgBouncer writes to it through a descriptor opened
// for appending, which then continues at the new end.
func rotatePoolerLog(path string) error {
	fi, err := os.Stat(path)
	if err != nil || fi.Size() < poolerLogMax {
		return nil
	}
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(path+".1", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.Truncate(path, 0)
}

func readFrom(path string, offset int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil
	}
	data, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return data
}

// spawnPooler starts PgBouncer in its own session as the server's OS user,
// inside its cgroup from the start (the same sh wrapper as postmasters,
// which also raises the open-file limit), output appended to its log.
func (rt *Runtime) spawnPooler(bin string, p poolerSpec, cg *instanceCgroup) (int, error) {
	m := rt.mgr
	// PgBouncer refuses to start over a pid file whose PID is alive, and
	// after a crash that PID may belong to anyone by now.
	if err := os.Remove(p.path(poolerPidFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	logPath := p.path(poolerLogFile)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logFile.Close() // the child has its own descriptor
	if err := m.chown(logPath); err != nil {
		return 0, err
	}
	var joinCgroup []string
	if cg != nil {
		joinCgroup = cg.procsFiles()
	}
	const script = `n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ >"$1"; shift; n=$((n-1)); done; ` +
		`ulimit -n "$2" 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$1" "$3"`
	args := append([]string{"-c", script, "dbcloud-pgbouncer", strconv.Itoa(len(joinCgroup))}, joinCgroup...)
	args = append(args, bin, strconv.Itoa(poolerNoFile), p.path(poolerIniFile))
	// Not exec.CommandContext: the pooler must outlive the request.
	cmd := exec.Command("/bin/sh", args...)
	cmd.Dir = p.Dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"}
	c, err := m.startChild(cmd)
	if err != nil {
		return 0, fmt.Errorf("run pgbouncer: %w", err)
	}
	if cg != nil {
		if err := cg.add(c.pid); err != nil {
			m.Logger.Warn("move pooler into its cgroup", "pooler", p.ID, "pid", c.pid, "error", err)
		}
	}
	m.Logger.Info("pooler started", "pooler", p.ID, "pid", c.pid, "port", p.Port)
	return c.pid, nil
}

// waitPooler waits until the pooler serves TLS with the service's
// certificate on its endpoint, as checkEndpoint proves it; a pooler that
// exits or never gets there is stopped and its log tail reported.
func (rt *Runtime) waitPooler(ctx context.Context, p poolerSpec, pid int, ep *dbcloud.Endpoint) error {
	begin := time.Now()
	deadline := begin.Add(poolerReadyTimeout)
	c := rt.mgr.childOf(pid)
	var last error
	for {
		if c != nil {
			select {
			case <-c.exited:
				return fmt.Errorf("pgbouncer (pid %d) exited: %v%s", pid, c.err, logTail(p.path(poolerLogFile), 0))
			default:
			}
		} else if !processAlive(pid) {
			return fmt.Errorf("pgbouncer (pid %d) exited%s", pid, logTail(p.path(poolerLogFile), 0))
		}
		probe, cancel := context.WithTimeout(ctx, time.Second)
		last = rt.checkEndpoint(probe, ep)
		cancel()
		if last == nil {
			if d := time.Since(begin); d > 50*time.Millisecond {
				rt.mgr.Logger.Info("pooler accepts connections", "pooler", p.ID, "pid", pid, "ms", d.Milliseconds())
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgbouncer (pid %d) not serving %s:%d after %v: %w%s",
				pid, ep.Host, ep.Port, poolerReadyTimeout, last, logTail(p.path(poolerLogFile), 0))
		}
		time.Sleep(pollInterval)
	}
}

// runningPooler trusts the pid file only as far as the process it names: it
// must be alive, not a zombie, and PgBouncer running this pooler's config.
func (rt *Runtime) runningPooler(p poolerSpec) (int, bool) {
	data, err := os.ReadFile(p.path(poolerPidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	if c := rt.mgr.childOf(pid); c != nil {
		select {
		case <-c.exited:
			return 0, false
		default:
		}
	}
	if !processAlive(pid) || !runsPooler(pid, p.path(poolerIniFile)) {
		return 0, false
	}
	return pid, true
}

// runsPooler reports whether pid is PgBouncer started with the config file
// ini (its only argument).
func runsPooler(pid int, ini string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || !strings.HasPrefix(filepath.Base(exe), "pgbouncer") {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(cmdline), "\x00"), ini)
}

// poolerProcesses finds every live PgBouncer running this pooler's config,
// with or without a pid file, plus anything left in its cgroup.
func (rt *Runtime) poolerProcesses(p poolerSpec, cg *instanceCgroup) []int {
	var pids []int
	ini := p.path(poolerIniFile)
	for _, pid := range allProcesses() {
		if pid != os.Getpid() && processAlive(pid) && runsPooler(pid, ini) {
			pids = append(pids, pid)
		}
	}
	if cg != nil {
		inGroup, _ := cg.procs()
		for _, pid := range inGroup {
			if !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// killPooler stops every process of the pooler, by PID: SIGINT (PgBouncer's
// safe shutdown: running transactions finish), then SIGTERM (immediate
// exit), then SIGKILL, each bounded; it waits until none is left.
func (rt *Runtime) killPooler(ctx context.Context, p poolerSpec, cg *instanceCgroup) error {
	begin := time.Now()
	deadline := begin.Add(poolerStopTimeout)
	steps := []struct {
		sig   syscall.Signal
		bound time.Duration
	}{
		{syscall.SIGINT, poolerStopTimeout / 2},
		{syscall.SIGTERM, poolerStopTimeout / 5},
		{syscall.SIGKILL, poolerStopTimeout},
	}
	for _, step := range steps {
		pids := rt.poolerProcesses(p, cg)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, step.sig); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("signal pooler %d: %w", pid, err)
			}
		}
		stopped := true
		for _, pid := range pids {
			if !waitExit(ctx, pid, rt.mgr.childOf(pid), min(step.bound, time.Until(deadline))) {
				stopped = false
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if stopped {
			rt.mgr.Logger.Info("pooler stopped", "pooler", p.ID, "pids", fmt.Sprint(pids), "signal", step.sig.String(),
				"ms", time.Since(begin).Milliseconds())
		}
	}
	if pids := rt.poolerProcesses(p, cg); len(pids) > 0 {
		return fmt.Errorf("pooler processes %v still alive after SIGKILL", pids)
	}
	return nil
}

// ensurePoolerAuth makes the lookup role and function right. The role's
// attributes and memberships are re-asserted every time (tsdbadmin has
// CREATEROLE, which in PostgreSQL 15 reaches every non-superuser role);
// the function is installed in every database that can be connected to,
// template1 included so that new databases have it, but only in those not
// yet done (a marker file lists them by OID): connecting to template1 makes
// a concurrent CREATE DATABASE fail, so it happens once, not on every
// reconcile.
func (rt *Runtime) ensurePoolerAuth(ctx context.Context, p poolerSpec, source InstanceSpec) error {
	m := rt.mgr
	conn, err := m.Connect(ctx, source, "postgres")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, poolerRoleSQL); err != nil {
		return fmt.Errorf("lookup role: %w", err)
	}
	// The marker is the cluster's: a different data directory (restored,
	// say) starts over.
	var sysID string
	if err := conn.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&sysID); err != nil {
		return err
	}
	rows, err := conn.Query(ctx, "SELECT oid::bigint, datname FROM pg_database WHERE datallowconn ORDER BY oid")
	if err != nil {
		return err
	}
	type database struct {
		oid  int64
		name string
	}
	var dbs []database
	for rows.Next() {
		var d database
		if err := rows.Scan(&d.oid, &d.name); err != nil {
			return err
		}
		dbs = append(dbs, d)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := m.makeServerDir(p.Dir); err != nil {
		return err
	}
	done := readAuthMarker(p.path(poolerAuthMarker), sysID)
	var installed []string
	for _, d := range dbs {
		key := strconv.FormatInt(d.oid, 10)
		if !done[key] {
			ok, err := rt.installLookup(ctx, source, d.name)
			if err != nil {
				return fmt.Errorf("lookup function in %s: %w", d.name, err)
			}
			if !ok {
				continue // not ours to fix; tried again next time
			}
		}
		installed = append(installed, key)
	}
	marker := "v" + poolerAuthVersion + " " + sysID + " " + strings.Join(installed, " ") + "\n"
	if err := m.writeFileAtomic(p.path(poolerAuthMarker), []byte(marker), 0o600); err != nil {
		return err
	}
	return nil
}

// readAuthMarker returns the OIDs of the databases that have the current
// lookup function, as the marker file lists them for this cluster.
func readAuthMarker(path, sysID string) map[string]bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	fields := strings.Fields(string(data))
	if len(fields) < 2 || fields[0] != "v"+poolerAuthVersion || fields[1] != sysID {
		return nil
	}
	done := map[string]bool{}
	for _, f := range fields[2:] {
		done[f] = true
	}
	return done
}

// installLookup creates the lookup function in one database. A schema
// "pgbouncer" someone else owns (a client may create one in a database it
// owns) is left alone: it reports false. PgBouncer then runs whatever
// function is there for that database, which can only refuse logins: the
// server checks every login's SCRAM proof itself, and PgBouncer's HBA never
// lets a client in as a role that enters by peer.
func (rt *Runtime) installLookup(ctx context.Context, source InstanceSpec, db string) (bool, error) {
	conn, err := rt.mgr.Connect(ctx, source, db)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var owner string
	err = conn.QueryRow(ctx, "SELECT pg_get_userbyid(nspowner)::text FROM pg_namespace WHERE nspname = 'pgbouncer'").Scan(&owner)
	if err == nil && owner != "postgres" {
		rt.mgr.Logger.Warn("schema pgbouncer belongs to another role; the pooler's lookup function is not installed there",
			"instance", source.ID, "database", db, "owner", owner)
		return false, nil
	}
	if _, err := conn.Exec(ctx, poolerLookupSQL); err != nil {
		return false, err
	}
	return true, nil
}

// poolerRoleSQL creates the lookup role and resets whatever a CREATEROLE
// client may have changed about it: attributes, password, settings and
// memberships either way.
const poolerRoleSQL = `
DO $$
DECLARE g record;
BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '` + poolerRole + `') THEN
		CREATE ROLE ` + poolerRole + `;
	END IF;
	FOR g IN
		SELECT r.rolname AS role, m.rolname AS member
		FROM pg_catalog.pg_auth_members a
		JOIN pg_catalog.pg_roles r ON r.oid = a.roleid
		JOIN pg_catalog.pg_roles m ON m.oid = a.member
		WHERE r.rolname = '` + poolerRole + `' OR m.rolname = '` + poolerRole + `'
	LOOP
		EXECUTE format('REVOKE %I FROM %I', g.role, g.member);
	END LOOP;
END
$$;
ALTER ROLE ` + poolerRole + ` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS
	CONNECTION LIMIT -1 PASSWORD NULL VALID UNTIL 'infinity';
ALTER ROLE ` + poolerRole + ` RESET ALL;
`

// poolerLookupSQL installs pgbouncer.get_auth in the current database. It
// runs as its owner, the superuser, with a fixed search_path, and answers
// only for roles that may log in, are not superusers and are not the lookup
// role; an expired password (VALID UNTIL) reads as none. Only the lookup
// role may call it.
const poolerLookupSQL = `
CREATE SCHEMA IF NOT EXISTS pgbouncer AUTHORIZATION postgres;
REVOKE ALL ON SCHEMA pgbouncer FROM PUBLIC;
GRANT USAGE ON SCHEMA pgbouncer TO ` + poolerRole + `;
CREATE OR REPLACE FUNCTION pgbouncer.get_auth(p_usename text)
RETURNS TABLE (usename name, passwd text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
	SELECT s.usename,
		CASE WHEN s.valuntil < pg_catalog.now() THEN NULL ELSE s.passwd END
	FROM pg_catalog.pg_shadow s
	WHERE s.usename = p_usename
		AND NOT s.usesuper
		AND s.usename <> '` + poolerRole + `'
$fn$;
ALTER FUNCTION pgbouncer.get_auth(text) OWNER TO postgres;
REVOKE ALL ON FUNCTION pgbouncer.get_auth(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO ` + poolerRole + `;
`
