package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgOSUser is the unprivileged OS user PostgreSQL runs as when dbcloud runs
// as root: initdb and postgres refuse to run as root.
const pgOSUser = "postgres"

const (
	// pollInterval is how often readiness and exits are checked. A start
	// takes tens of milliseconds, so a coarse poll (pg_ctl's 100 ms) would
	// dominate it.
	pollInterval = 5 * time.Millisecond
	// readyTimeout bounds a start: recovery after a crash can take a while,
	// but a server not accepting connections after this is broken.
	readyTimeout = 30 * time.Second
	// recoveryTimeout bounds a start that recovers a fork, which replays
	// WAL before it accepts connections: up to a day's WAL for PITR.
	recoveryTimeout = time.Hour
	// reloadTimeout bounds how long Reload waits to observe the reload.
	reloadTimeout = 10 * time.Second
	// defaultStopTimeout is used by Destroy and when Stop gets no bound.
	defaultStopTimeout = 30 * time.Second
	// maxSocketPath is the longest unix socket path Linux accepts
	// (sizeof(sun_path) - 1).
	maxSocketPath = 107
)

// InstanceSpec says everything instance-specific. All of it lives outside
// the data directory (config_file, hba_file and ident_file are given on the
// postgres command line) because copies and pg_rewind overwrite what is
// inside.
type InstanceSpec struct {
	// ID is unique on the host, e.g. "<serviceID>-0"; it names the cgroup
	// and the cluster (cluster_name, shown in ps).
	ID string
	// Dir is the instance root (absolute): Dir/pgdata (data directory),
	// Dir/run (unix socket), Dir/log (server logs) and Dir/conf
	// (postgresql.conf, pg_hba.conf, pg_ident.conf, server.crt, server.key).
	Dir string
	// ListenAddr is listen_addresses, e.g. "127.0.0.1".
	ListenAddr string
	Port       int
	// Settings are GUCs from the service size (shared_buffers,
	// max_connections, work_mem, ...). Settings dbcloud owns (port, ssl,
	// logging, ...) are rejected.
	Settings map[string]string
	// CertPEM and KeyPEM are the TLS server certificate and key (ssl=on).
	CertPEM, KeyPEM []byte
	// CPUMillis is the cgroup CPU quota; 0 means no limit.
	CPUMillis int
	// MemoryBytes is the cgroup memory limit; 0 means no limit.
	MemoryBytes int64
	// ArchiveDir, when set, is where the instance archives its WAL
	// (basic_archive): the service's archive, shared by its instances,
	// since only the primary archives. Prepare creates it.
	ArchiveDir string
	// RecoverySettings are passed on the postgres command line, never
	// written to a file, by the one start that recovers a fork: they
	// vanish with that postmaster instead of lingering in the config.
	RecoverySettings map[string]string
}

func (s InstanceSpec) pgdata() string              { return filepath.Join(s.Dir, "pgdata") }
func (s InstanceSpec) runDir() string              { return filepath.Join(s.Dir, "run") }
func (s InstanceSpec) logDir() string              { return filepath.Join(s.Dir, "log") }
func (s InstanceSpec) confDir() string             { return filepath.Join(s.Dir, "conf") }
func (s InstanceSpec) confPath(name string) string { return filepath.Join(s.confDir(), name) }

// instanceID is what may appear in a cgroup path and in cluster_name.
var instanceID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

func (s InstanceSpec) validate() error {
	switch {
	case !instanceID.MatchString(s.ID):
		return fmt.Errorf("instance id %q: want 1-63 letters, digits, '_', '.' or '-'", s.ID)
	case !filepath.IsAbs(s.Dir) || filepath.Clean(s.Dir) != s.Dir:
		return fmt.Errorf("instance dir %q must be a clean absolute path", s.Dir)
	case len(filepath.Join(s.runDir(), ".s.PGSQL.65535")) > maxSocketPath:
		return fmt.Errorf("instance dir %q is too long for a unix socket path (%d bytes max)", s.Dir, maxSocketPath)
	case s.Port < 1 || s.Port > 65535:
		return fmt.Errorf("port %d out of range", s.Port)
	case len(s.CertPEM) == 0 || len(s.KeyPEM) == 0:
		return errors.New("a TLS certificate and key are required (ssl=on)")
	case s.CPUMillis < 0 || s.MemoryBytes < 0:
		return errors.New("limits must not be negative")
	case s.ArchiveDir != "" && (!filepath.IsAbs(s.ArchiveDir) || filepath.Clean(s.ArchiveDir) != s.ArchiveDir):
		return fmt.Errorf("archive dir %q must be a clean absolute path", s.ArchiveDir)
	}
	for k := range s.RecoverySettings {
		if !settingName.MatchString(k) {
			return fmt.Errorf("recovery setting %q is not a valid parameter name", k)
		}
	}
	return validateSettings(s.Settings)
}

// Manager runs PostgreSQL instances on this host: it prepares data
// directories (from a pool of clusters made ahead of time), starts, adopts,
// stops and reconfigures postmasters, and confines each instance to its own
// cgroups. Instances outlive the Manager: a new Manager adopts postmasters
// that are already running.
type Manager struct {
	// BinDir holds the PostgreSQL binaries (initdb, postgres).
	BinDir string
	// PoolDir is where prepared clusters wait. It must be on the same
	// filesystem as the instance directories, so taking one is a rename.
	PoolDir string
	// PoolSize is how many prepared clusters to keep; 0 disables the pool.
	PoolSize int
	Logger   *slog.Logger

	cred         *syscall.Credential // nil: PostgreSQL runs as the current user
	cgroupMounts cgroupMounts
	cgroupWarn   sync.Once
	exdevWarn    sync.Once
	oomWarn      sync.Once

	mu       sync.Mutex
	children map[int]*child         // postmasters this process started and must reap
	locks    map[string]*sync.Mutex // per instance Dir

	refill chan struct{} // wakes the pool loop after a take
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// child is a postmaster started by this process: only its parent can reap
// it, and until reaped a dead postmaster is a zombie that still holds its
// PID and looks alive to kill(pid, 0).
type child struct {
	pid    int
	exited chan struct{}
	err    error // valid once exited is closed
}

// NewManager returns a Manager using the PostgreSQL binaries in binDir and
// keeping poolSize prepared clusters in poolDir (after Open).
func NewManager(binDir, poolDir string, poolSize int, logger *slog.Logger) (*Manager, error) {
	for _, bin := range []string{"postgres", "initdb"} {
		if fi, err := os.Stat(filepath.Join(binDir, bin)); err != nil || !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("PostgreSQL binary %s not found in %s (set --pg-bin-dir)", bin, binDir)
		}
	}
	poolDir, err := filepath.Abs(poolDir)
	if err != nil {
		return nil, fmt.Errorf("pool dir: %w", err)
	}
	if poolSize < 0 {
		return nil, fmt.Errorf("pool size %d must not be negative", poolSize)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	mounts := cgroupMounts{}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		mounts = findCgroupMounts(f)
		f.Close()
	}
	return &Manager{
		BinDir:       binDir,
		PoolDir:      poolDir,
		PoolSize:     poolSize,
		Logger:       logger,
		cred:         cred,
		cgroupMounts: mounts,
		children:     map[int]*child{},
		locks:        map[string]*sync.Mutex{},
		refill:       make(chan struct{}, 1),
	}, nil
}

// serverCredential returns the identity PostgreSQL runs as: nil (the
// current user) normally, or the postgres OS user when we are root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(pgOSUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, so PostgreSQL must run as OS user %q, but looking it up failed: %w", pgOSUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse uid %q of %s: %w", u.Uid, pgOSUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse gid %q of %s: %w", u.Gid, pgOSUser, err)
	}
	// No supplementary groups: the server gets its own uid and gid only.
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// lock serializes the operations on one instance.
func (m *Manager) lock(dir string) func() {
	m.mu.Lock()
	l, ok := m.locks[dir]
	if !ok {
		l = &sync.Mutex{}
		m.locks[dir] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Prepare makes Dir/pgdata if it does not exist, by taking a prepared
// cluster from the pool (a rename, so it is instant) or, if the pool is
// empty, by preparing one now; then it (always) writes the config files in
// Dir/conf atomically. It is idempotent.
func (m *Manager) Prepare(ctx context.Context, s InstanceSpec) error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("prepare instance %s: %w", s.ID, err)
	}
	defer m.lock(s.Dir)()
	if err := m.prepare(ctx, s); err != nil {
		return fmt.Errorf("prepare instance %s: %w", s.ID, err)
	}
	return nil
}

func (m *Manager) prepare(ctx context.Context, s InstanceSpec) error {
	// The instance root is ours: make it traversable (os.MkdirTemp makes
	// 0700) so the postgres user can reach the directories inside.
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		return err
	}
	if err := m.checkTraversable(s.Dir); err != nil {
		return err
	}
	if _, err := os.Lstat(s.pgdata()); errors.Is(err, fs.ErrNotExist) {
		if err := m.makeDataDir(ctx, s); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	// Left by a crash during an inline preparation that an earlier Prepare
	// did not get to redo (the data directory came from elsewhere since).
	if err := removeWorkDir(filepath.Join(s.Dir, ".prepare")); err != nil {
		return err
	}
	for _, dir := range []string{s.runDir(), s.logDir()} {
		if err := m.makeServerDir(dir); err != nil {
			return err
		}
	}
	if s.ArchiveDir != "" {
		if err := m.makeServerDir(s.ArchiveDir); err != nil {
			return err
		}
	}
	return m.writeConfig(s)
}

// makeDataDir puts a fresh cluster at Dir/pgdata: from the pool if it has
// one, else made now.
func (m *Manager) makeDataDir(ctx context.Context, s InstanceSpec) error {
	start := time.Now()
	took, err := m.takeFromPool(s.pgdata())
	if err != nil {
		return err
	}
	if took {
		m.Logger.Info("instance data directory taken from pool", "instance", s.ID, "ms", time.Since(start).Milliseconds())
		return nil
	}
	// Inline: prepare in Dir/.prepare, which shares Dir's filesystem, and
	// rename into place only when complete, so a crash leaves no half-made
	// pgdata (the next Prepare starts over).
	work := filepath.Join(s.Dir, ".prepare")
	if err := removeWorkDir(work); err != nil {
		return err
	}
	defer removeWorkDir(work)
	if err := m.prepareCluster(ctx, work); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(work, "pgdata"), s.pgdata()); err != nil {
		return err
	}
	if err := syncDir(s.Dir); err != nil {
		return err
	}
	m.Logger.Info("instance data directory prepared inline (pool empty)", "instance", s.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// makeServerDir creates a directory PostgreSQL writes into, owned by the
// server's OS user and private to it.
func (m *Manager) makeServerDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return m.chown(dir)
}

func (m *Manager) chown(path string) error {
	if m.cred == nil {
		return nil
	}
	return os.Lchown(path, int(m.cred.Uid), int(m.cred.Gid))
}

// checkTraversable fails, naming the directory, when the server's OS user
// cannot reach dir because an ancestor denies it search permission. It does
// not loosen permissions on directories it does not own.
func (m *Manager) checkTraversable(dir string) error {
	return traversable(m.cred, dir)
}

// ServerCanReach reports, as an error naming the obstacle, whether the OS
// user PostgreSQL runs as can reach dir.
func ServerCanReach(dir string) error {
	cred, err := serverCredential()
	if err != nil {
		return err
	}
	return traversable(cred, dir)
}

func traversable(cred *syscall.Credential, dir string) error {
	if cred == nil {
		return nil
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("stat %s: no owner information", p)
		}
		var bit os.FileMode = 0o001
		switch {
		case st.Uid == cred.Uid:
			bit = 0o100
		case st.Gid == cred.Gid:
			bit = 0o010
		}
		if fi.Mode().Perm()&bit == 0 {
			return fmt.Errorf("OS user %q (uid %d) cannot traverse %s (mode %v)", pgOSUser, cred.Uid, p, fi.Mode().Perm())
		}
		if parent := filepath.Dir(p); parent == p {
			return nil
		}
	}
}

// writeConfig writes the instance's config files, TLS certificate and key
// into Dir/conf, each atomically, owned by the server's OS user (PostgreSQL
// refuses a key others can read).
func (m *Manager) writeConfig(s InstanceSpec) error {
	if err := m.makeServerDir(s.confDir()); err != nil {
		return err
	}
	pgConf, hba, ident := RenderConfig(s)
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{certFile, s.CertPEM, 0o644},
		{keyFile, s.KeyPEM, 0o600},
		{hbaFile, []byte(hba), 0o600},
		{identFile, []byte(ident), 0o600},
		{confFile, []byte(pgConf), 0o600},
	} {
		if err := m.writeFileAtomic(s.confPath(f.name), f.data, f.perm); err != nil {
			return err
		}
	}
	return syncDir(s.confDir())
}

// writeFileAtomic replaces path so that PostgreSQL (which may re-read it at
// any SIGHUP) and a crash see the old or the new content, never a torn
// file: temp file in the same directory, mode and owner set before any
// data, fsync, rename. The caller fsyncs the directory.
func (m *Manager) writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if m.cred != nil {
		if err := f.Chown(int(m.cred.Uid), int(m.cred.Gid)); err != nil {
			return err
		}
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Start starts the postmaster if it is not running and waits until it
// accepts connections. A live postmaster of this data directory is adopted:
// nothing is started. It returns the postmaster's PID.
//
// The postmaster runs in its own session as the postgres OS user (when we
// are root), so it survives a restart of dbcloud; its stdout and stderr go
// to Dir/log/startup.log. It joins the instance's cgroups before postgres
// even runs (a tiny sh wrapper writes its own PID into cgroup.procs and then
// execs postgres), so every process it forks is confined from birth.
func (m *Manager) Start(ctx context.Context, s InstanceSpec) (int, error) {
	if err := s.validate(); err != nil {
		return 0, fmt.Errorf("start instance %s: %w", s.ID, err)
	}
	defer m.lock(s.Dir)()
	pid, err := m.start(ctx, s)
	if err != nil {
		return 0, fmt.Errorf("start instance %s: %w", s.ID, err)
	}
	return pid, nil
}

func (m *Manager) start(ctx context.Context, s InstanceSpec) (int, error) {
	cg := m.ensureCgroup(s.ID)
	if cg != nil {
		if err := cg.setLimits(s.CPUMillis, s.MemoryBytes); err != nil {
			return 0, fmt.Errorf("set limits: %w", err)
		}
	}
	if pid, ok := m.running(s); ok {
		if cg != nil && !cg.contains(pid, m.cgroupMounts) {
			// Started before its cgroup existed (or by an older dbcloud).
			m.moveTree(cg, pid)
		}
		if err := m.waitReady(ctx, s, pid, m.childOf(pid)); err != nil {
			return 0, err
		}
		m.Logger.Debug("instance adopted", "instance", s.ID, "pid", pid)
		return pid, nil
	}
	for _, f := range []string{filepath.Join(s.pgdata(), "PG_VERSION"), s.confPath(confFile)} {
		if _, err := os.Stat(f); err != nil {
			return 0, fmt.Errorf("not prepared: %w", err)
		}
	}
	// Backends of a killed postmaster keep its shared memory attached, and
	// a new postmaster refuses to start until they are gone.
	if err := m.killLeftovers(ctx, s, cg, time.Now().Add(10*time.Second)); err != nil {
		return 0, err
	}
	// The PID in a stale lock file may belong to another process by now,
	// which would make postgres refuse to start.
	if err := os.Remove(filepath.Join(s.pgdata(), "postmaster.pid")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	for _, dir := range []string{s.runDir(), s.logDir()} {
		if err := m.makeServerDir(dir); err != nil {
			return 0, err
		}
	}

	begin := time.Now()
	logPath := filepath.Join(s.logDir(), "startup.log")
	args := []string{"-D", s.pgdata(),
		"-c", "config_file=" + s.confPath(confFile),
		"-c", "hba_file=" + s.confPath(hbaFile),
		"-c", "ident_file=" + s.confPath(identFile),
	}
	for _, name := range sortedKeys(s.RecoverySettings) {
		args = append(args, "-c", name+"="+s.RecoverySettings[name])
	}
	var joinCgroup []string
	if cg != nil {
		joinCgroup = cg.procsFiles()
	}
	c, logStart, err := m.spawnPostmaster(s.Dir, logPath, args, joinCgroup)
	if err != nil {
		return 0, err
	}
	if cg != nil {
		// Also from here, as root: if the wrapper's write failed, the
		// postmaster is still moved before it has forked anything.
		if err := cg.add(c.pid); err != nil {
			m.Logger.Warn("move postmaster into its cgroup", "instance", s.ID, "pid", c.pid, "error", err)
		}
	}
	if m.cred != nil {
		// The OOM killer should pick a backend, never the postmaster;
		// backends reset their own score (PG_OOM_ADJUST_VALUE).
		if err := writeControlFile(fmt.Sprintf("/proc/%d/oom_score_adj", c.pid), "-1000"); err != nil {
			m.oomWarn.Do(func() {
				m.Logger.Warn("cannot protect postmasters from the OOM killer (needs CAP_SYS_RESOURCE)", "error", err)
			})
		}
	}
	if err := m.waitReady(ctx, s, c.pid, c); err != nil {
		m.abort(s, c, cg)
		// The logging collector writes the reason (a bind failure, say)
		// on its own schedule: give it a moment to reach the file (a
		// loaded host needed more than a second).
		detail := serverErrors(s.logDir(), begin)
		for wait := time.Now().Add(3 * time.Second); detail == "" && time.Now().Before(wait); {
			time.Sleep(20 * time.Millisecond)
			detail = serverErrors(s.logDir(), begin)
		}
		if detail == "" {
			detail = logTail(logPath, logStart)
		}
		return 0, fmt.Errorf("%w%s", err, detail)
	}
	m.Logger.Info("instance started", "instance", s.ID, "pid", c.pid, "ms", time.Since(begin).Milliseconds())
	return c.pid, nil
}

// spawnPostmaster runs postgres with args in its own session as the
// server's OS user, output appended to logPath, and returns it with the log
// offset at which its output starts. With joinCgroup, a sh wrapper first
// writes its own PID into each of those cgroup.procs files, then execs
// postgres, so the postmaster is confined before it runs at all (cgroup v1
// has no way to spawn straight into a group).
func (m *Manager) spawnPostmaster(dir, logPath string, args, joinCgroup []string) (*child, int64, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, err
	}
	defer logFile.Close() // the child has its own descriptor
	if err := m.chown(logPath); err != nil {
		return nil, 0, err
	}
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, 0, err
	}
	postgres := filepath.Join(m.BinDir, "postgres")
	// Not exec.CommandContext: the server must outlive the request.
	cmd := exec.Command(postgres, args...)
	if len(joinCgroup) > 0 {
		const script = `n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ >"$1"; shift; n=$((n-1)); done; exec "$@"`
		wrapped := append([]string{"-c", script, "dbcloud-postgres", strconv.Itoa(len(joinCgroup))}, joinCgroup...)
		cmd = exec.Command("/bin/sh", append(append(wrapped, postgres), args...)...)
	}
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"LANG=C",
		// Backends make themselves the OOM killer's preferred victims.
		"PG_OOM_ADJUST_FILE=/proc/self/oom_score_adj",
		"PG_OOM_ADJUST_VALUE=0",
	}
	c, err := m.startChild(cmd)
	if err != nil {
		return nil, 0, fmt.Errorf("run postgres: %w", err)
	}
	return c, logStart, nil
}

// startChild starts cmd as the server's OS user in a session of its own, so
// no signal aimed at dbcloud's terminal or process group reaches it and it
// survives dbcloud's exit, and reaps it when it exits: until reaped, a dead
// server is a zombie that still holds its PID and looks alive.
func (m *Manager) startChild(cmd *exec.Cmd) (*child, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: m.cred}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{pid: cmd.Process.Pid, exited: make(chan struct{})}
	m.mu.Lock()
	m.children[c.pid] = c
	m.mu.Unlock()
	go func() {
		c.err = cmd.Wait()
		m.mu.Lock()
		delete(m.children, c.pid)
		m.mu.Unlock()
		close(c.exited)
	}()
	return c, nil
}

func (m *Manager) childOf(pid int) *child {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.children[pid]
}

// waitReady polls postmaster.pid until the postmaster of pid reports that
// it accepts connections ("ready", or "standby" for a hot standby); this is
// what pg_ctl -w checks, but every 5 ms instead of every 100 ms.
func (m *Manager) waitReady(ctx context.Context, s InstanceSpec, pid int, c *child) error {
	bound, standbyReady := readyTimeout, true
	if len(s.RecoverySettings) > 0 {
		// A fork's recovery reports "standby" as soon as it starts, with
		// or without hot standby; it is done when promoted ("ready").
		bound, standbyReady = recoveryTimeout, false
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var exited <-chan struct{}
	if c != nil {
		exited = c.exited
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		pf, err := readPidFile(s.pgdata())
		if err == nil && pf.pid == pid && (pf.status == "ready" || pf.status == "standby" && standbyReady) {
			return nil
		}
		if c == nil && !processAlive(pid) {
			return fmt.Errorf("postmaster (pid %d) exited during startup", pid)
		}
		select {
		case <-exited:
			return fmt.Errorf("postmaster (pid %d) exited during startup: %v", pid, c.err)
		case <-ctx.Done():
			return fmt.Errorf("postmaster (pid %d) not ready: %w", pid, ctx.Err())
		case <-tick.C:
		}
	}
}

// abort kills a postmaster whose start failed, and everything it forked.
func (m *Manager) abort(s InstanceSpec, c *child, cg *instanceCgroup) {
	_ = syscall.Kill(c.pid, syscall.SIGQUIT)
	select {
	case <-c.exited:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(c.pid, syscall.SIGKILL)
		<-c.exited
	}
	_ = m.killLeftovers(context.Background(), s, cg, time.Now().Add(5*time.Second))
}

// logTail returns what a failed postmaster wrote after offset, for the
// error message: the cause ("could not bind", a bad setting) is there.
func logTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > 4096 {
		offset = fi.Size() - 4096
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	data, _ := io.ReadAll(f)
	if len(bytes.TrimSpace(data)) == 0 {
		return ""
	}
	return fmt.Sprintf(" (log %s: %s)", path, strings.TrimSpace(string(data)))
}

// serverErrors returns the problems the server wrote to its JSON logs since
// a start began: warnings and worse, and LOG lines with an error code (the
// bind failure is one). In PostgreSQL 15 the logging collector starts
// before the postmaster binds its sockets, so the cause of a failed start
// ("could not bind ...: Address already in use") is there, not in
// startup.log.
func serverErrors(logDir string, since time.Time) string {
	since = since.Truncate(time.Millisecond) // the log's precision
	files, _ := filepath.Glob(filepath.Join(logDir, "postgresql-*.json"))
	var msgs []string
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil || fi.ModTime().Before(since) {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if len(data) > 64<<10 {
			data = data[len(data)-64<<10:]
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			var entry struct {
				Timestamp string `json:"timestamp"`
				Severity  string `json:"error_severity"`
				Code      string `json:"state_code"`
				Message   string `json:"message"`
			}
			if json.Unmarshal(line, &entry) != nil {
				continue
			}
			switch entry.Severity {
			case "WARNING", "ERROR", "FATAL", "PANIC":
			case "LOG":
				if entry.Code == "00000" || entry.Code == "" {
					continue
				}
			default:
				continue
			}
			// "2026-11-22 00:16:19.281 UTC"
			if ts, err := time.Parse("2006-01-02 15:04:05.000 MST", entry.Timestamp); err != nil || ts.Before(since) {
				continue
			}
			msgs = append(msgs, entry.Severity+": "+entry.Message)
		}
	}
	if len(msgs) == 0 {
		return ""
	}
	return " (" + strings.Join(msgs, "; ") + ")"
}

// pidFile is what postmaster.pid says (PG 10+ layout).
type pidFile struct {
	pid    int
	port   int    // line 4: the port it listens on
	status string // line 8: "starting", "stopping", "ready" or "standby"
}

func readPidFile(pgdata string) (pidFile, error) {
	data, err := os.ReadFile(filepath.Join(pgdata, "postmaster.pid"))
	if err != nil {
		return pidFile{}, err
	}
	lines := strings.Split(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		return pidFile{}, fmt.Errorf("postmaster.pid: bad pid %q", lines[0])
	}
	pf := pidFile{pid: pid}
	if len(lines) > 3 {
		pf.port, _ = strconv.Atoi(strings.TrimSpace(lines[3]))
	}
	if len(lines) > 7 {
		pf.status = strings.TrimSpace(lines[7])
	}
	return pf, nil
}

// Running reports whether a live postmaster serves the data directory, and
// its PID.
func (m *Manager) Running(s InstanceSpec) (pid int, ok bool) {
	return m.running(s)
}

// running trusts postmaster.pid only as far as the process it names: that
// process must exist, not be a zombie (a killed postmaster stays one until
// its parent reaps it), and be a postgres whose working directory is this
// data directory (the postmaster chdirs there), not a process that reused
// the PID.
func (m *Manager) running(s InstanceSpec) (int, bool) {
	pf, err := readPidFile(s.pgdata())
	if err != nil {
		return 0, false
	}
	if c := m.childOf(pf.pid); c != nil {
		select {
		case <-c.exited:
			return 0, false
		default:
		}
	}
	real, err := filepath.EvalSymlinks(s.pgdata())
	if err != nil || !processAlive(pf.pid) || !servesDataDir(pf.pid, real) {
		return 0, false
	}
	return pf.pid, true
}

// processState returns the state letter of /proc/PID/stat ('R', 'S', 'Z',
// ...) and the parent PID.
func processState(pid int) (state byte, ppid int, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// "pid (comm) S ppid ..."; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+2:]))
	if len(fields) < 2 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	ppid, err = strconv.Atoi(fields[1])
	return fields[0][0], ppid, err
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	state, _, err := processState(pid)
	return err == nil && state != 'Z' && state != 'X'
}

// servesDataDir reports whether pid runs the postgres binary with the data
// directory (a path with symlinks resolved) as its working directory. Every
// PostgreSQL process chdirs into its data directory, so this identifies the
// cluster without trusting argv.
func servesDataDir(pid int, pgdata string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || !strings.HasPrefix(filepath.Base(exe), "postgres") {
		return false
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	return err == nil && cwd == pgdata
}

// allProcesses lists the PIDs in /proc.
func allProcesses() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// serverProcesses finds the live postgres processes of a data directory,
// whichever cgroup they are in: the fallback when cgroups are unavailable,
// and a check that nothing escaped them.
func serverProcesses(pgdata string) []int {
	real, err := filepath.EvalSymlinks(pgdata)
	if err != nil {
		return nil // no data directory, no server
	}
	var pids []int
	for _, pid := range allProcesses() {
		if pid != os.Getpid() && servesDataDir(pid, real) && processAlive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// moveTree moves a running postmaster and the children it already forked
// into cg (backends make themselves session leaders, so the process group
// holds only the postmaster; the tree is found by parent PID).
func (m *Manager) moveTree(cg *instanceCgroup, root int) {
	pids := []int{root}
	parents := map[int]int{}
	for _, pid := range allProcesses() {
		if _, ppid, err := processState(pid); err == nil {
			parents[pid] = ppid
		}
	}
	for i := 0; i < len(pids); i++ {
		for pid, ppid := range parents {
			if ppid == pids[i] {
				pids = append(pids, pid)
			}
		}
	}
	for _, pid := range pids {
		if err := cg.add(pid); err != nil && processAlive(pid) {
			m.Logger.Warn("move process into cgroup", "pid", pid, "error", err)
		}
	}
}

// killLeftovers SIGKILLs every process left in the instance's cgroup or
// still working in its data directory, and waits until none is left. It is
// only called once the postmaster is dead: what remains are backends that
// have not yet noticed, and they hold the old shared memory.
func (m *Manager) killLeftovers(ctx context.Context, s InstanceSpec, cg *instanceCgroup, deadline time.Time) error {
	for {
		pids := serverProcesses(s.pgdata())
		if cg != nil {
			inGroup, err := cg.procs()
			if err != nil {
				return err
			}
			for _, pid := range inGroup {
				if !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of instance %s still alive after SIGKILL", pids, s.ID)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}

// Stop stops the instance: SIGTERM (smart shutdown) briefly, then SIGINT
// (fast), then SIGQUIT (immediate), each with a bound, by PID; then it
// SIGKILLs anything left in its cgroup or data directory and waits until
// nothing is. It reaps the postmaster if it is our child. It is a no-op if
// the instance is not running; timeout bounds the whole stop.
func (m *Manager) Stop(ctx context.Context, s InstanceSpec, timeout time.Duration) error {
	defer m.lock(s.Dir)()
	if err := m.stop(ctx, s, timeout); err != nil {
		return fmt.Errorf("stop instance %s: %w", s.ID, err)
	}
	return nil
}

func (m *Manager) stop(ctx context.Context, s InstanceSpec, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = defaultStopTimeout
	}
	begin := time.Now()
	deadline := begin.Add(timeout)
	pid, ok := m.running(s)
	if ok {
		c := m.childOf(pid)
		steps := []struct {
			sig   syscall.Signal
			bound time.Duration
		}{
			{syscall.SIGTERM, min(timeout/10, time.Second)}, // smart: waits for clients
			{syscall.SIGINT, timeout / 2},                   // fast: disconnects them, checkpoints
			{syscall.SIGQUIT, timeout / 5},                  // immediate: no checkpoint
			{syscall.SIGKILL, time.Until(deadline)},
		}
		stopped := false
		for _, step := range steps {
			if err := syscall.Kill(pid, step.sig); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("signal postmaster %d: %w", pid, err)
			}
			if stopped = waitExit(ctx, pid, c, step.bound); stopped {
				m.Logger.Info("instance stopped", "instance", s.ID, "pid", pid, "signal", step.sig.String(),
					"ms", time.Since(begin).Milliseconds())
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if !stopped {
			return fmt.Errorf("postmaster %d still alive after SIGKILL", pid)
		}
	}
	cg := m.cgroupOf(s.ID)
	if cg != nil && !cg.exists() {
		cg = nil
	}
	if err := m.killLeftovers(ctx, s, cg, deadline); err != nil {
		return err
	}
	if !ok {
		return nil
	}
	// Unlike a clean shutdown, a killed postmaster leaves its lock file,
	// and tools that start a single-user server (pg_rewind) trip over it
	// while the dead postmaster is an unreaped zombie.
	if pf, err := readPidFile(s.pgdata()); err == nil && pf.pid == pid {
		_ = os.Remove(filepath.Join(s.pgdata(), "postmaster.pid"))
	}
	return nil
}

// waitExit waits up to bound for pid to exit. A child is waited for through
// its reaper; any other process counts as exited once it is gone or a
// zombie.
func waitExit(ctx context.Context, pid int, c *child, bound time.Duration) bool {
	timer := time.NewTimer(max(bound, 0))
	defer timer.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if c == nil && !processAlive(pid) {
			return true
		}
		var exited <-chan struct{}
		if c != nil {
			exited = c.exited
		}
		select {
		case <-exited:
			return true
		case <-ctx.Done():
			return false
		case <-timer.C:
			return c == nil && !processAlive(pid)
		case <-tick.C:
		}
	}
}

// Reload writes the config (as Prepare does) and makes the postmaster
// re-read it (SIGHUP). It reports whether a restart is needed because a
// restart-only (postmaster context) setting differs from the running value,
// as PostgreSQL itself decides it (pg_settings.pending_restart). If the
// instance is not running the new config takes effect at its next start.
func (m *Manager) Reload(ctx context.Context, s InstanceSpec) (restartNeeded bool, err error) {
	if err := s.validate(); err != nil {
		return false, fmt.Errorf("reload instance %s: %w", s.ID, err)
	}
	defer m.lock(s.Dir)()
	restartNeeded, err = m.reload(ctx, s)
	if err != nil {
		return false, fmt.Errorf("reload instance %s: %w", s.ID, err)
	}
	return restartNeeded, nil
}

func (m *Manager) reload(ctx context.Context, s InstanceSpec) (bool, error) {
	if err := m.writeConfig(s); err != nil {
		return false, err
	}
	pid, ok := m.running(s)
	if !ok {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, reloadTimeout)
	defer cancel()
	conn, err := m.Connect(ctx, s, "postgres")
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The postmaster reloads on SIGHUP and then signals every backend, which
	// reloads before its next command; pending_restart is only meaningful
	// once this backend has reloaded, i.e. its pg_conf_load_time advanced.
	var before time.Time
	if err := conn.QueryRow(ctx, "SELECT pg_conf_load_time()").Scan(&before); err != nil {
		return false, err
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return false, fmt.Errorf("signal postmaster %d: %w", pid, err)
	}
	for {
		var reloaded bool
		if err := conn.QueryRow(ctx, "SELECT pg_conf_load_time() > $1", before).Scan(&reloaded); err != nil {
			return false, fmt.Errorf("wait for reload: %w", err)
		}
		if reloaded {
			break
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("wait for reload: %w", ctx.Err())
		case <-time.After(pollInterval):
		}
	}
	var pending []string
	if err := conn.QueryRow(ctx,
		"SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM pg_settings WHERE pending_restart").Scan(&pending); err != nil {
		return false, err
	}
	m.Logger.Info("instance reloaded", "instance", s.ID, "pid", pid, "pending_restart", strings.Join(pending, ","))
	return len(pending) > 0, nil
}

// SetLimits applies CPUMillis (cpu.cfs_quota_us = millis*100 per 100 ms
// period) and MemoryBytes (memory.limit_in_bytes) to the running instance.
// Without usable cgroups it does nothing (Start logged why, once).
func (m *Manager) SetLimits(s InstanceSpec) error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("set limits of instance %s: %w", s.ID, err)
	}
	cg := m.ensureCgroup(s.ID)
	if cg == nil {
		return nil
	}
	if err := cg.setLimits(s.CPUMillis, s.MemoryBytes); err != nil {
		return fmt.Errorf("set limits of instance %s: %w", s.ID, err)
	}
	return nil
}

// Limits of dbcloud's statements on tenant databases (see Connect).
const (
	TenantLockTimeout      = "3s"
	TenantStatementTimeout = "5min"
)

// Connect returns a superuser connection over the unix socket in Dir/run:
// peer authentication maps the OS user dbcloud runs as to the postgres
// role, so no superuser password exists. The caller closes it.
func (m *Manager) Connect(ctx context.Context, s InstanceSpec, db string) (*pgx.Conn, error) {
	dsn := fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable application_name=dbcloud connect_timeout=10",
		quoteDSN(s.runDir()), s.Port, quoteDSN(db))
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("connect to instance %s: %w", s.ID, err)
	}
	// The database belongs to a tenant, who may hold locks or make any
	// statement slow: dbcloud's own statements give up instead of waiting
	// behind them.
	cfg.RuntimeParams["lock_timeout"] = TenantLockTimeout
	cfg.RuntimeParams["statement_timeout"] = TenantStatementTimeout
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to instance %s: %w", s.ID, err)
	}
	return conn, nil
}

// quoteDSN quotes a keyword/value connection string value.
func quoteDSN(v string) string {
	v = strings.ReplaceAll(v, `\`, `\\`)
	return "'" + strings.ReplaceAll(v, `'`, `\'`) + "'"
}

// Exec runs SQL as the superuser on database db (see Connect).
func (m *Manager) Exec(ctx context.Context, s InstanceSpec, db, sql string, args ...any) error {
	if _, ok := ctx.Deadline(); !ok {
		// Past statement_timeout, also the connection is not waited for.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 6*time.Minute)
		defer cancel()
	}
	conn, err := m.Connect(ctx, s, db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("exec on instance %s: %w", s.ID, err)
	}
	return nil
}

// Usage is what an instance consumes right now.
type Usage struct {
	// CPUNanos is the CPU time used since the cgroup was created
	// (cpuacct.usage); a rate needs two samples.
	CPUNanos uint64
	// MemoryBytes is the working set: memory.usage_in_bytes minus
	// total_inactive_file.
	MemoryBytes int64
	// StorageBytes is the size of the data directory, WAL included.
	StorageBytes int64
}

// Usage reads the instance's CPU time and memory working set from its
// cgroups (zero without cgroups) and sums the file sizes in Dir/pgdata.
func (m *Manager) Usage(s InstanceSpec) (Usage, error) {
	var u Usage
	if cg := m.cgroupOf(s.ID); cg != nil && cg.exists() {
		cpu, mem, err := cg.usage()
		if err != nil {
			return Usage{}, fmt.Errorf("usage of instance %s: %w", s.ID, err)
		}
		u.CPUNanos, u.MemoryBytes = cpu, mem
	}
	size, err := dirSize(s.pgdata())
	if err != nil {
		return Usage{}, fmt.Errorf("usage of instance %s: %w", s.ID, err)
	}
	u.StorageBytes = size
	return u, nil
}

// dirSize sums the sizes of the regular files under dir. Files that vanish
// during the walk (recycled WAL, temp files) are skipped.
func dirSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != dir {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total, err
}

// Destroy stops the instance and removes Dir and its cgroups. It is
// idempotent.
func (m *Manager) Destroy(ctx context.Context, s InstanceSpec) error {
	if !filepath.IsAbs(s.Dir) || filepath.Clean(s.Dir) != s.Dir || s.Dir == "/" {
		return fmt.Errorf("destroy instance %s: refusing dir %q", s.ID, s.Dir)
	}
	if !instanceID.MatchString(s.ID) {
		return fmt.Errorf("destroy instance %s: invalid id", s.ID)
	}
	defer m.lock(s.Dir)()
	if err := m.stop(ctx, s, defaultStopTimeout); err != nil {
		return fmt.Errorf("destroy instance %s: %w", s.ID, err)
	}
	if cg := m.cgroupOf(s.ID); cg != nil {
		if err := cg.remove(time.Now().Add(5 * time.Second)); err != nil {
			return fmt.Errorf("destroy instance %s: %w", s.ID, err)
		}
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		return fmt.Errorf("destroy instance %s: %w", s.ID, err)
	}
	m.Logger.Info("instance destroyed", "instance", s.ID)
	return nil
}

// HostCapacity returns the host's CPUs (in millicores), memory and the free
// disk space of dir's filesystem (of its nearest existing ancestor if dir
// does not exist yet).
func HostCapacity(dir string) (cpuMillis int, memBytes, diskFreeBytes int64, err error) {
	cpuMillis = runtime.NumCPU() * 1000
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("host capacity: %w", err)
	}
	for _, line := range strings.Split(string(meminfo), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, 0, 0, fmt.Errorf("host capacity: parse MemTotal %q: %w", v, err)
			}
			memBytes = kb * 1024
		}
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("host capacity: %w", err)
	}
	var st syscall.Statfs_t
	for {
		err = syscall.Statfs(dir, &st)
		if !errors.Is(err, syscall.ENOENT) || dir == "/" {
			break
		}
		dir = filepath.Dir(dir)
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("host capacity: statfs %s: %w", dir, err)
	}
	return cpuMillis, memBytes, int64(st.Bavail) * int64(st.Bsize), nil
}
