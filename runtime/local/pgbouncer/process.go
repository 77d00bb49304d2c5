package pgbouncer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/internal/cgroup"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"
)

// run writes the pooler's files and makes PgBouncer run with them: it
// adopts a running one (reloading it when the config changed, restarting
// it when a startup-only setting did) or starts one. It returns the PID.
func (ps *Poolers) run(ctx context.Context, p Spec) (int, error) {
	if err := ps.instances.MakeServerDir(p.Target, p.Dir); err != nil {
		return 0, err
	}
	ini, hba := renderPoolerConfig(p)
	// The pooler's directory is its OS user's: what is there is read
	// without following a link or waiting on a FIFO.
	old, _ := tenantfs.ReadFile(p.path(poolerIniFile))
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
		if err := ps.instances.WriteServerFile(p.Target, p.path(f.name), f.data, f.perm); err != nil {
			return 0, err
		}
	}
	if err := atomicfile.SyncDir(p.Dir); err != nil {
		return 0, err
	}
	if err := rotateLog(p.path(poolerLogFile)); err != nil {
		ps.logger.Warn("rotate pooler log", "pooler", p.ID, "error", err)
	}
	cg := ps.cgroups.Ensure(p.ID, ps.instances.Owner(p.Target))
	if cg != nil {
		if err := cg.SetLimits(cgroup.Limits{MemoryBytes: poolerMemoryBytes}); err != nil {
			return 0, fmt.Errorf("set pooler limits: %w", err)
		}
	}
	if pid, ok := ps.pid(p); ok {
		if cg != nil && !cg.Contains(pid) {
			if err := cg.Add(pid); err != nil {
				ps.logger.Warn("move pooler into its cgroup", "pooler", p.ID, "pid", pid, "error", err)
			}
		}
		switch {
		case !changed:
			ps.logger.Debug("pooler adopted", "pooler", p.ID, "pid", pid)
			return pid, nil
		case restartSignature(old) == restartSignature(ini):
			if err := ps.reload(ctx, p, pid); err != nil {
				return 0, err
			}
			return pid, nil
		}
		ps.logger.Info("restarting pooler for new startup settings", "pooler", p.ID, "pid", pid)
	}
	// Whatever still runs with this config (the one to restart, or one a
	// crash left without its pid file) goes first: it holds the port.
	if err := ps.kill(ctx, p, cg); err != nil {
		return 0, err
	}
	return ps.spawn(p, cg)
}

// reload makes PgBouncer re-read its config (SIGHUP) and waits until its
// log shows it did.
func (ps *Poolers) reload(ctx context.Context, p Spec, pid int) error {
	logPath := p.path(poolerLogFile)
	var offset int64
	if fi, err := tenantfs.Lstat(logPath); err == nil && fi.Mode().IsRegular() {
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
			ps.logger.Info("pooler reloaded", "pooler", p.ID, "pid", pid, "ms", time.Since(begin).Milliseconds())
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pooler %d did not reload: %w", pid, ctx.Err())
		case <-time.After(proc.PollInterval):
		}
	}
}

// logMax is the size at which the pooler's log is rotated (checked at
// every ensure), keeping one older generation.
const logMax = 16 << 20

// rotateLog copies a log grown past logMax to <log>.1 and empties it in
// place: PgBouncer writes to it through a descriptor opened for appending,
// which then continues at the new end. The directory is the pooler's OS
// user's, so both files are opened through tenantfs (a link or a FIFO in
// their place is refused), and the log is emptied through the descriptor
// that was copied, not by its name again.
func rotateLog(path string) error {
	dir, err := tenantfs.OpenDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	name := filepath.Base(path)
	src, err := dir.OpenFile(name, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil || fi.Size() < logMax {
		return err
	}
	dst, err := dir.OpenFile(name+".1", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
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
	return src.Truncate(0)
}

func readFrom(path string, offset int64) []byte {
	f, err := tenantfs.Open(path)
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

// spawn starts PgBouncer through the supervisor: in its own session as the
// server's OS user, inside its cgroup from the start, with a raised
// open-file limit, output appended to its log.
func (ps *Poolers) spawn(p Spec, cg *cgroup.Group) (int, error) {
	// PgBouncer refuses to start over a pid file whose PID is alive, and
	// after a crash that PID may belong to anyone by now.
	if err := os.Remove(p.path(poolerPidFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	spec := proc.Spec{
		Path: ps.binary, Args: []string{p.path(poolerIniFile)}, Dir: p.Dir,
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"},
		Credential: ps.instances.Owner(p.Target), LogPath: p.path(poolerLogFile),
		NoFile: poolerNoFile,
	}
	cg.Confine(&spec)
	c, _, err := ps.sup.Spawn(spec)
	if err != nil {
		return 0, fmt.Errorf("run pgbouncer: %w", err)
	}
	if cg != nil {
		if err := cg.Add(c.PID); err != nil {
			ps.logger.Warn("move pooler into its cgroup", "pooler", p.ID, "pid", c.PID, "error", err)
		}
	}
	ps.logger.Info("pooler started", "pooler", p.ID, "pid", c.PID, "port", p.Port)
	return c.PID, nil
}

// wait waits until the pooler serves TLS with the target's certificate on
// its endpoint; a pooler that exits or never gets there is reported with
// its log tail.
func (ps *Poolers) wait(ctx context.Context, p Spec, pid int) error {
	begin := time.Now()
	deadline := begin.Add(poolerReadyTimeout)
	addr := net.JoinHostPort(p.Host, strconv.Itoa(p.Port))
	var last error
	for {
		if !ps.sup.Live(pid, nil) {
			return fmt.Errorf("pgbouncer (pid %d) exited%s", pid, proc.LogTail(p.path(poolerLogFile), 0))
		}
		probe, cancel := context.WithTimeout(ctx, time.Second)
		last = postgres.ProbeTLS(probe, addr, p.Host, ps.roots)
		cancel()
		if last == nil {
			if d := time.Since(begin); d > 50*time.Millisecond {
				ps.logger.Info("pooler accepts connections", "pooler", p.ID, "pid", pid, "ms", d.Milliseconds())
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgbouncer (pid %d) not serving %s after %v: %w%s",
				pid, addr, poolerReadyTimeout, last, proc.LogTail(p.path(poolerLogFile), 0))
		}
		time.Sleep(proc.PollInterval)
	}
}

// pid trusts the pid file only as far as the process it names: it must be
// alive, not a zombie, and PgBouncer running this pooler's config.
func (ps *Poolers) pid(p Spec) (int, bool) {
	pid, err := proc.ReadPID(p.path(poolerPidFile))
	if err != nil {
		return 0, false
	}
	ini := p.path(poolerIniFile)
	return pid, ps.sup.Live(pid, func(pid int) bool { return runsPooler(pid, ini) })
}

// runsPooler reports whether pid is PgBouncer started with the config file
// ini (its only argument).
func runsPooler(pid int, ini string) bool {
	return strings.HasPrefix(filepath.Base(proc.Exe(pid)), "pgbouncer") && slices.Contains(proc.Args(pid), ini)
}

// processes finds every live PgBouncer running this pooler's config, with
// or without a pid file, plus anything left in its cgroup.
func (ps *Poolers) processes(p Spec, cg *cgroup.Group) []int {
	ini := p.path(poolerIniFile)
	pids := proc.Find(func(pid int) bool { return runsPooler(pid, ini) })
	if cg != nil {
		inGroup, _ := cg.Procs()
		for _, pid := range inGroup {
			if !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// kill stops every process of the pooler, by PID: SIGINT (PgBouncer's safe
// shutdown: running transactions finish), then SIGTERM (immediate exit),
// then SIGKILL, each bounded; it waits until none is left.
func (ps *Poolers) kill(ctx context.Context, p Spec, cg *cgroup.Group) error {
	begin := time.Now()
	find := func() []int { return ps.processes(p, cg) }
	sig, err := ps.sup.Stop(ctx, find, []proc.Step{
		{Signal: syscall.SIGINT, Bound: poolerStopTimeout / 2},
		{Signal: syscall.SIGTERM, Bound: poolerStopTimeout / 5},
		{Signal: syscall.SIGKILL, Bound: poolerStopTimeout * 3 / 10},
	})
	if err != nil {
		return fmt.Errorf("stop pooler %s: %w", p.ID, err)
	}
	if sig != 0 {
		ps.logger.Info("pooler stopped", "pooler", p.ID, "signal", sig.String(), "ms", time.Since(begin).Milliseconds())
	}
	return nil
}
