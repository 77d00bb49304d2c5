package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/internal/proc"
)

// Controller starts, reconfigures and stops endpoint proxies, each in a
// directory of its own that holds its config, pid file and log.
type Controller struct {
	sup    *proc.Supervisor
	logger *slog.Logger
	// exe is the binary that runs the proxy (Command): dbcloud itself.
	exe string
}

// NewController returns a controller that spawns proxies through sup,
// running exe (the dbcloud binary; "" for os.Executable()).
func NewController(sup *proc.Supervisor, exe string, logger *slog.Logger) (*Controller, error) {
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("endpoint proxy: %w", err)
		}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Controller{sup: sup, logger: logger, exe: exe}, nil
}

// pid returns the PID of the live proxy of dir, checked against its
// command line so a reused PID is not taken for it.
func (c *Controller) pid(dir string) (int, bool) {
	pid, err := proc.ReadPID(filepath.Join(dir, proxyPidFile))
	if err != nil {
		return 0, false
	}
	isProxy := func(pid int) bool {
		args := proc.Args(pid)
		return len(args) == 3 && args[1] == Command && args[2] == dir
	}
	return pid, c.sup.Live(pid, isProxy)
}

// Running reports whether the proxy of dir runs.
func (c *Controller) Running(dir string) bool {
	_, ok := c.pid(dir)
	return ok
}

// Set makes the proxy of dir listen on listen and forward to targets
// (none: refuse every connection), starting it if it does not run, and
// returns once the proxy has applied exactly this config.
//
// The proxy runs as owner (nil: dbcloud's own user), which owns dir: it
// faces the network, so it never runs as root when dbcloud does.
func (c *Controller) Set(ctx context.Context, dir string, owner *syscall.Credential, listen []string, targets ...string) error {
	return c.apply(ctx, dir, owner, proxyConfig{Listen: listen, Targets: targets})
}

// Pause is Set with every new connection held, not forwarded, until the
// next Set: existing connections stay as they are.
func (c *Controller) Pause(ctx context.Context, dir string, owner *syscall.Credential, listen []string, targets ...string) error {
	return c.apply(ctx, dir, owner, proxyConfig{Listen: listen, Targets: targets, Paused: true})
}

func (c *Controller) apply(ctx context.Context, dir string, owner *syscall.Credential, cfg proxyConfig) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var opts []atomicfile.Option
	if owner != nil {
		if err := os.Lchown(dir, int(owner.Uid), int(owner.Gid)); err != nil {
			return err
		}
		opts = append(opts, atomicfile.Owner(int(owner.Uid), int(owner.Gid)))
	}
	cfg.Generation = time.Now().UnixNano()
	data, _ := json.Marshal(cfg)
	if err := atomicfile.Write(filepath.Join(dir, proxyConfigFile), data, 0o600, opts...); err != nil {
		return err
	}
	pid, ok := c.pid(dir)
	if ok && owner != nil {
		// One started as another user (root, before services had OS
		// users of their own) is replaced: clients reconnect.
		if uid, err := proc.UID(pid); err == nil && uid != owner.Uid {
			c.logger.Info("restarting endpoint proxy as its service's OS user", "dir", dir, "pid", pid, "uid", uid)
			if err := c.stopPID(ctx, dir); err != nil {
				return err
			}
			ok = false
		}
	}
	if ok {
		if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
			return fmt.Errorf("signal proxy %d: %w", pid, err)
		}
	} else {
		var err error
		if pid, err = c.spawn(dir, owner); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(proxyApplyTimeout)
	for {
		// The proxy's directory is its OS user's: a FIFO there must not
		// hold this loop, nor a link make root read another file.
		raw, _ := tenantfs.ReadFile(filepath.Join(dir, proxyAppliedFile))
		if g, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64); err == nil && g == cfg.Generation {
			if _, ok := c.pid(dir); ok {
				c.logger.Debug("endpoint proxy applied its config", "dir", dir, "pid", pid)
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxy in %s did not apply its config within %v%s", dir, proxyApplyTimeout,
				proc.LogTail(filepath.Join(dir, proxyLogFile), 0))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(proc.PollInterval):
		}
	}
}

// spawn starts the proxy in its own session, so it outlives dbcloud and
// keeps client connections open across a restart of the control plane.
func (c *Controller) spawn(dir string, owner *syscall.Credential) (int, error) {
	_ = os.Remove(filepath.Join(dir, proxyPidFile))
	child, _, err := c.sup.Spawn(proc.Spec{
		Path: c.exe, Args: []string{Command, dir}, Dir: dir,
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"},
		LogPath:    filepath.Join(dir, proxyLogFile),
		Credential: owner,
	})
	if err != nil {
		return 0, fmt.Errorf("start proxy: %w", err)
	}
	return child.PID, nil
}

// Stop stops the proxy of dir by PID (SIGTERM, then SIGKILL) and removes
// its files. It is idempotent.
func (c *Controller) Stop(ctx context.Context, dir string) error {
	if err := c.stopPID(ctx, dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// stopPID stops the proxy of dir by PID (SIGTERM, then SIGKILL).
func (c *Controller) stopPID(ctx context.Context, dir string) error {
	find := func() []int {
		if pid, ok := c.pid(dir); ok {
			return []int{pid}
		}
		return nil
	}
	if _, err := c.sup.Stop(ctx, find, []proc.Step{
		{Signal: syscall.SIGTERM, Bound: 5 * time.Second},
		{Signal: syscall.SIGKILL, Bound: 5 * time.Second},
	}); err != nil {
		return fmt.Errorf("stop proxy in %s: %w", dir, err)
	}
	return nil
}
