package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/internal/cgroup"
	"dbcloud/runtime/local/internal/proc"
)

// Start starts the postmaster if it is not running and waits until it
// accepts connections. A live postmaster of this data directory is adopted:
// nothing is started. It returns the postmaster's PID.
//
// The postmaster runs in its own session as the postgres OS user (when we
// are root), so it survives a restart of dbcloud; its stdout and stderr go
// to Dir/log/startup.log. It joins the instance's cgroups before postgres
// even runs (a tiny sh wrapper writes its own PID into cgroup.procs and then
// execs postgres), so every process it forks is confined from birth.
func (m *Instances) Start(ctx context.Context, s Spec) (int, error) {
	if err := s.validate(); err != nil {
		return 0, fmt.Errorf("start instance %s: %w", s.ID, err)
	}
	defer m.Lock(s.Dir)()
	pid, err := m.start(ctx, s)
	if err != nil {
		return 0, fmt.Errorf("start instance %s: %w", s.ID, err)
	}
	return pid, nil
}

func (m *Instances) start(ctx context.Context, s Spec) (int, error) {
	cg := m.cgroups.Ensure(s.ID, m.Owner(s))
	if cg != nil {
		if err := cg.SetLimits(s.limits()); err != nil {
			return 0, fmt.Errorf("set limits: %w", err)
		}
	}
	if pid, ok := m.Running(s); ok {
		if cg != nil && !cg.Contains(pid) {
			// Started before its cgroup existed (or by an older dbcloud).
			m.moveTree(cg, pid)
		}
		if err := m.waitReady(ctx, s, pid, m.sup.Child(pid)); err != nil {
			return 0, err
		}
		m.Logger.Debug("instance adopted", "instance", s.ID, "pid", pid)
		return pid, nil
	}
	for _, f := range []string{filepath.Join(s.PGData(), "PG_VERSION"), s.ConfPath(confFile)} {
		if _, err := tenantfs.Lstat(f); err != nil {
			return 0, fmt.Errorf("not prepared: %w", err)
		}
	}
	if err := checkFreeSpace(s.PGData()); err != nil {
		return 0, err
	}
	// Backends of a killed postmaster keep its shared memory attached, and
	// a new postmaster refuses to start until they are gone. Finding them
	// reads every process of the host (about 100 ms with 1,700 of them), so
	// it is skipped where nothing can be left: no postmaster.pid (a
	// postmaster writes it before it forks anything, and only a clean
	// shutdown removes it: a cluster fresh from the pool) and an empty
	// cgroup, which confines every process of the instance from birth.
	if !m.nothingLeft(s, cg) {
		if err := m.killLeftovers(ctx, s, cg, time.Now().Add(10*time.Second)); err != nil {
			return 0, err
		}
	}
	// The PID in a stale lock file may belong to another process by now,
	// which would make postgres refuse to start.
	if err := os.Remove(filepath.Join(s.PGData(), "postmaster.pid")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	for _, dir := range []string{s.RunDir(), s.LogDir()} {
		if err := m.MakeServerDir(s, dir); err != nil {
			return 0, err
		}
	}

	begin := time.Now()
	logPath := filepath.Join(s.LogDir(), "startup.log")
	args := []string{"-D", s.PGData(),
		"-c", "config_file=" + s.ConfPath(confFile),
		"-c", "hba_file=" + s.ConfPath(hbaFile),
		"-c", "ident_file=" + s.ConfPath(identFile),
	}
	for _, name := range sortedKeys(s.RecoverySettings) {
		args = append(args, "-c", name+"="+s.RecoverySettings[name])
	}
	c, logStart, err := m.spawnPostmaster(s.Dir, logPath, args, s, cg)
	if err != nil {
		return 0, err
	}
	if cg != nil {
		// Also from here, as root: if the wrapper's write failed, the
		// postmaster is still moved before it has forked anything.
		if err := cg.Add(c.PID); err != nil {
			m.Logger.Warn("move postmaster into its cgroup", "instance", s.ID, "pid", c.PID, "error", err)
		}
	}
	if m.cred != nil {
		// The OOM killer should pick a backend, never the postmaster;
		// backends reset their own score (PG_OOM_ADJUST_VALUE).
		if err := proc.WriteControlFile(fmt.Sprintf("/proc/%d/oom_score_adj", c.PID), "-1000"); err != nil {
			m.oomWarn.Do(func() {
				m.Logger.Warn("cannot protect postmasters from the OOM killer (needs CAP_SYS_RESOURCE)", "error", err)
			})
		}
	}
	if err := m.waitReady(ctx, s, c.PID, c); err != nil {
		m.abort(s, c, cg)
		// The logging collector has written the reason (a bind failure,
		// say) by the time it exits; the file may still need a moment to
		// show it.
		detail := serverErrors(s.LogDir(), begin)
		for wait := time.Now().Add(3 * time.Second); detail == "" && time.Now().Before(wait); {
			time.Sleep(20 * time.Millisecond)
			detail = serverErrors(s.LogDir(), begin)
		}
		if detail == "" {
			detail = proc.LogTail(logPath, logStart)
		}
		return 0, fmt.Errorf("%w%s", err, detail)
	}
	m.Logger.Info("instance started", "instance", s.ID, "pid", c.PID, "ms", time.Since(begin).Milliseconds())
	return c.PID, nil
}

// nothingLeft reports whether no process of the instance can be left
// from an earlier postmaster: none wrote postmaster.pid, and its cgroup
// (which must be in use) holds no process.
func (m *Instances) nothingLeft(s Spec, cg *cgroup.Group) bool {
	if cg == nil {
		return false
	}
	if _, err := os.Lstat(filepath.Join(s.PGData(), "postmaster.pid")); !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	procs, err := cg.Procs()
	return err == nil && len(procs) == 0
}

// spawnPostmaster runs postgres with args through the supervisor: in its
// own session as the server's OS user, output appended to logPath, and
// inside cg (when not nil) before it runs at all. It returns the child and
// the log offset of its output.
func (m *Instances) spawnPostmaster(dir, logPath string, args []string, s Spec, cg *cgroup.Group) (*proc.Child, int64, error) {
	spec := proc.Spec{
		Path: filepath.Join(m.binDir(s), "postgres"), Args: args, Dir: dir,
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"LANG=C",
			// Backends make themselves the OOM killer's preferred victims.
			"PG_OOM_ADJUST_FILE=/proc/self/oom_score_adj",
			"PG_OOM_ADJUST_VALUE=0",
		},
		Credential: m.Owner(s), LogPath: logPath,
	}
	cg.Confine(&spec)
	return m.sup.Spawn(spec)
}

// waitReady polls postmaster.pid until the postmaster of pid reports that
// it accepts connections ("ready", or "standby" for a hot standby); this is
// what pg_ctl -w checks, but every 5 ms instead of every 100 ms.
func (m *Instances) waitReady(ctx context.Context, s Spec, pid int, c *proc.Child) error {
	bound, standbyReady := readyTimeout, true
	if len(s.RecoverySettings) > 0 || s.Sealed {
		// A fork's recovery reports "standby" as soon as it starts, with
		// or without hot standby; it is done when promoted ("ready"). A
		// sealed start is a fork's crash recovery from its backup label:
		// it replays what the backup needs before it is ready.
		bound, standbyReady = recoveryTimeout, false
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var exited <-chan struct{}
	if c != nil {
		exited = c.Exited()
	}
	tick := time.NewTicker(proc.PollInterval)
	defer tick.Stop()
	for {
		pf, err := ReadPidFile(s.PGData())
		if err == nil && pf.PID == pid && (pf.Status == "ready" || pf.Status == "standby" && standbyReady) {
			return nil
		}
		if c == nil && !proc.Alive(pid) {
			return fmt.Errorf("postmaster (pid %d) exited during startup", pid)
		}
		select {
		case <-exited:
			return fmt.Errorf("postmaster (pid %d) exited during startup: %v", pid, c.Err())
		case <-ctx.Done():
			return fmt.Errorf("postmaster (pid %d) not ready: %w", pid, ctx.Err())
		case <-tick.C:
		}
	}
}

// abort kills a postmaster whose start failed, and everything it forked.
// The logging collector outlives the postmaster until it has written what
// the postmaster sent it, which is why the start failed: what is left gets
// abortGrace to exit by itself before it is killed, so the reason is on
// disk rather than lost with a killed collector.
func (m *Instances) abort(s Spec, c *proc.Child, cg *cgroup.Group) {
	_ = syscall.Kill(c.PID, syscall.SIGQUIT)
	select {
	case <-c.Exited():
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(c.PID, syscall.SIGKILL)
		<-c.Exited()
	}
	for deadline := time.Now().Add(abortGrace); time.Now().Before(deadline); time.Sleep(proc.PollInterval) {
		if len(serverProcesses(s.PGData())) == 0 {
			break
		}
	}
	_ = m.killLeftovers(context.Background(), s, cg, time.Now().Add(5*time.Second))
}

// serverErrors returns the problems the server wrote to its JSON logs since
// a start began: warnings and worse, and LOG lines with an error code (the
// bind failure is one). In PostgreSQL 15 the logging collector starts
// before the postmaster binds its sockets, so the cause of a failed start
// ("could not bind ...: Address already in use") is there, not in
// startup.log. The log directory is the server's OS user's: files are read
// through tenantfs, so a link or FIFO there is skipped.
func serverErrors(logDir string, since time.Time) string {
	since = since.Truncate(time.Millisecond) // the log's precision
	files, _ := filepath.Glob(filepath.Join(logDir, "postgresql-*.json"))
	var msgs []string
	for _, f := range files {
		data := readTail(f, since, 64<<10)
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

// readTail returns the last limit bytes of the regular file at path if it
// was modified at or after since, nil otherwise or on any error.
func readTail(path string, since time.Time, limit int64) []byte {
	f, err := tenantfs.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.ModTime().Before(since) {
		return nil
	}
	if _, err := f.Seek(max(fi.Size()-limit, 0), io.SeekStart); err != nil {
		return nil
	}
	data, _ := io.ReadAll(io.LimitReader(f, limit))
	return data
}
