package postgres

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"dbcloud/runtime/local/internal/proc"
)

// Reload writes the config (as Prepare does) and makes the postmaster
// re-read it (SIGHUP). It reports whether a restart is needed because a
// restart-only (postmaster context) setting differs from the running value,
// as PostgreSQL itself decides it (pg_settings.pending_restart). If the
// instance is not running the new config takes effect at its next start.
func (m *Instances) Reload(ctx context.Context, s Spec) (restartNeeded bool, err error) {
	if err := s.validate(); err != nil {
		return false, fmt.Errorf("reload instance %s: %w", s.ID, err)
	}
	defer m.Lock(s.Dir)()
	restartNeeded, err = m.reload(ctx, s)
	if err != nil {
		return false, fmt.Errorf("reload instance %s: %w", s.ID, err)
	}
	return restartNeeded, nil
}

func (m *Instances) reload(ctx context.Context, s Spec) (bool, error) {
	if err := m.writeConfig(s); err != nil {
		return false, err
	}
	pid, ok := m.Running(s)
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
		case <-time.After(proc.PollInterval):
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
func (m *Instances) SetLimits(s Spec) error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("set limits of instance %s: %w", s.ID, err)
	}
	cg := m.cgroups.Ensure(s.ID, m.Owner(s))
	if cg == nil {
		return nil
	}
	if err := cg.SetLimits(s.limits()); err != nil {
		return fmt.Errorf("set limits of instance %s: %w", s.ID, err)
	}
	return nil
}

// Ensure makes the instance run with spec: it prepares it (its data
// directory must exist, or, for a new primary, comes from the pool),
// rewrites its config and reloads a running postmaster, restarting it when
// a restart-only setting changed (the port, when a service turns HA, say),
// applies its limits and starts it if it does not run. It is the one path
// by which the runtime brings an instance to its spec.
func (m *Instances) Ensure(ctx context.Context, spec Spec) error {
	// A postmaster running as another OS user than its service's (one
	// started before services had identities of their own) stops before
	// Prepare gives its files to the service's user.
	if pid, running := m.Running(spec); running {
		if c := m.Owner(spec); c != nil {
			if uid, err := proc.UID(pid); err == nil && uid != c.Uid {
				m.Logger.Info("restarting as the service's own OS user", "instance", spec.ID, "uid", uid, "want_uid", c.Uid)
				if err := m.Stop(ctx, spec, defaultStopTimeout); err != nil {
					return fmt.Errorf("stop %s to change its OS user: %w", spec.ID, err)
				}
			}
		}
	}
	if err := m.Prepare(ctx, spec); err != nil {
		return err
	}
	if _, running := m.Running(spec); running {
		restart, err := m.Reload(ctx, spec)
		if err != nil {
			// A postmaster that cannot take a reload, such as one a crash of
			// the control plane left in a shutdown that waits for sessions,
			// is stopped (Stop escalates) and started afresh.
			m.Logger.Warn("reload failed; restarting the instance", "instance", spec.ID, "error", err)
			restart = true
		}
		if restart {
			m.Logger.Info("restarting for new settings", "instance", spec.ID)
			if err := m.Stop(ctx, spec, defaultStopTimeout); err != nil {
				return fmt.Errorf("stop %s for restart: %w", spec.ID, err)
			}
		}
	}
	if err := m.SetLimits(spec); err != nil {
		return err
	}
	_, err := m.Start(ctx, spec)
	return err
}
