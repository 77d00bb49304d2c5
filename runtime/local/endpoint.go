package local

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"

	"dbcloud/runtime/local/internal/osuser"
)

// A service's endpoint port belongs to its proxy process
// (runtime/local/proxy) once the service is HA, and a read replica set's
// always: its files are in DATA/services/<id>/proxy.

func (rt *Runtime) proxyDir(serviceID string) string {
	return filepath.Join(rt.serviceDir(serviceID), "proxy")
}

func (rt *Runtime) proxyRunning(serviceID string) bool {
	return rt.proxies.Running(rt.proxyDir(serviceID))
}

// setProxy makes the proxy of a service (or read replica set) listen on
// listen and forward to targets (none: refuse), and returns once it applies
// exactly that.
// It runs as owner, the OS identity of the service (a read replica set's
// is its parent's).
func (rt *Runtime) setProxy(ctx context.Context, serviceID string, owner *osuser.Identity, listen []string, targets ...string) error {
	var cred *syscall.Credential
	if owner != nil {
		cred = owner.Credential()
	}
	if err := rt.proxies.Set(ctx, rt.proxyDir(serviceID), cred, listen, targets...); err != nil {
		return err
	}
	rt.cfg.Logger.Info("endpoint proxy set", "service", serviceID, "targets", strings.Join(targets, ","))
	return nil
}

// stopProxy stops the service's proxy and removes its files; idempotent.
func (rt *Runtime) stopProxy(ctx context.Context, serviceID string) error {
	return rt.proxies.Stop(ctx, rt.proxyDir(serviceID))
}

// pauseProxy is setProxy with new connections held, not forwarded, until
// the next setProxy (a major version switch).
func (rt *Runtime) pauseProxy(ctx context.Context, serviceID string, owner *osuser.Identity, listen []string, targets ...string) error {
	var cred *syscall.Credential
	if owner != nil {
		cred = owner.Credential()
	}
	if err := rt.proxies.Pause(ctx, rt.proxyDir(serviceID), cred, listen, targets...); err != nil {
		return err
	}
	rt.cfg.Logger.Info("endpoint proxy paused", "service", serviceID, "targets", strings.Join(targets, ","))
	return nil
}
