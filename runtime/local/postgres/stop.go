package postgres

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"dbcloud/runtime/local/internal/cgroup"
	"dbcloud/runtime/local/internal/proc"
)

// killLeftovers SIGKILLs every process left in the instance's cgroup or
// still working in its data directory, and waits until none is left. It is
// only called once the postmaster is dead: what remains are backends that
// have not yet noticed, and they hold the old shared memory.
func (m *Instances) killLeftovers(ctx context.Context, s Spec, cg *cgroup.Group, deadline time.Time) error {
	err := proc.KillAll(ctx, func() ([]int, error) {
		pids := serverProcesses(s.PGData())
		if cg != nil {
			inGroup, err := cg.Procs()
			if err != nil {
				return nil, err
			}
			for _, pid := range inGroup {
				if !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
		}
		return pids, nil
	}, deadline)
	if err != nil {
		return fmt.Errorf("instance %s: %w", s.ID, err)
	}
	return nil
}

// Stop stops the instance: SIGTERM (smart shutdown) briefly, then SIGINT
// (fast), then SIGQUIT (immediate), each with a bound, by PID; then it
// SIGKILLs anything left in its cgroup or data directory and waits until
// nothing is. It reaps the postmaster if it is our child. It is a no-op if
// the instance is not running; timeout bounds the whole stop.
func (m *Instances) Stop(ctx context.Context, s Spec, timeout time.Duration) error {
	defer m.Lock(s.Dir)()
	if err := m.stop(ctx, s, timeout, false); err != nil {
		return fmt.Errorf("stop instance %s: %w", s.ID, err)
	}
	return nil
}

// StopImmediately is Stop without the shutdown checkpoint: SIGQUIT, then
// SIGKILL. The next start recovers from the WAL, so it is for a server
// whose every commit is also elsewhere already and whose stop must be
// quick: the old cluster at a BLUE_GREEN switch.
func (m *Instances) StopImmediately(ctx context.Context, s Spec, timeout time.Duration) error {
	defer m.Lock(s.Dir)()
	if err := m.stop(ctx, s, timeout, true); err != nil {
		return fmt.Errorf("stop instance %s: %w", s.ID, err)
	}
	return nil
}

func (m *Instances) stop(ctx context.Context, s Spec, timeout time.Duration, immediate bool) error {
	if timeout <= 0 {
		timeout = defaultStopTimeout
	}
	begin := time.Now()
	deadline := begin.Add(timeout)
	pid, ok := m.Running(s)
	if ok {
		postmaster := func() []int {
			if p, ok := m.Running(s); ok && p == pid {
				return []int{pid}
			}
			return nil
		}
		steps := []proc.Step{
			{Signal: syscall.SIGTERM, Bound: min(timeout/10, time.Second)}, // smart: waits for clients
			{Signal: syscall.SIGINT, Bound: timeout / 2},                   // fast: disconnects them, checkpoints
			{Signal: syscall.SIGQUIT, Bound: timeout / 5},                  // immediate: no checkpoint
			{Signal: syscall.SIGKILL, Bound: time.Until(deadline)},
		}
		if immediate {
			steps = steps[2:]
		}
		sig, err := m.sup.Stop(ctx, postmaster, steps)
		if err != nil {
			return fmt.Errorf("postmaster %d: %w", pid, err)
		}
		if sig != 0 {
			m.Logger.Info("instance stopped", "instance", s.ID, "pid", pid, "signal", sig.String(),
				"ms", time.Since(begin).Milliseconds())
		}
	}
	cg := m.cgroups.Of(s.ID)
	if cg != nil && !cg.Exists() {
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
	if pf, err := ReadPidFile(s.PGData()); err == nil && pf.PID == pid {
		_ = os.Remove(filepath.Join(s.PGData(), "postmaster.pid"))
	}
	return nil
}

// Destroy stops the instance and removes Dir and its cgroups. It is
// idempotent.
func (m *Instances) Destroy(ctx context.Context, s Spec) error {
	if !filepath.IsAbs(s.Dir) || filepath.Clean(s.Dir) != s.Dir || s.Dir == "/" {
		return fmt.Errorf("destroy instance %s: refusing dir %q", s.ID, s.Dir)
	}
	if !instanceID.MatchString(s.ID) {
		return fmt.Errorf("destroy instance %s: invalid id", s.ID)
	}
	defer m.Lock(s.Dir)()
	if err := m.stop(ctx, s, defaultStopTimeout, false); err != nil {
		return fmt.Errorf("destroy instance %s: %w", s.ID, err)
	}
	if cg := m.cgroups.Of(s.ID); cg != nil {
		if err := cg.Remove(time.Now().Add(5 * time.Second)); err != nil {
			return fmt.Errorf("destroy instance %s: %w", s.ID, err)
		}
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		return fmt.Errorf("destroy instance %s: %w", s.ID, err)
	}
	m.Logger.Info("instance destroyed", "instance", s.ID)
	return nil
}
