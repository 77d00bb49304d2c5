package local

import (
	"context"
	"path/filepath"
	"strings"
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
func (rt *Runtime) setProxy(ctx context.Context, serviceID string, listen []string, targets ...string) error {
	if err := rt.proxies.Set(ctx, rt.proxyDir(serviceID), listen, targets...); err != nil {
		return err
	}
	rt.cfg.Logger.Info("endpoint proxy set", "service", serviceID, "targets", strings.Join(targets, ","))
	return nil
}

// stopProxy stops the service's proxy and removes its files; idempotent.
func (rt *Runtime) stopProxy(ctx context.Context, serviceID string) error {
	return rt.proxies.Stop(ctx, rt.proxyDir(serviceID))
}
