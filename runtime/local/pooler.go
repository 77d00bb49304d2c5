package local

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"dbcloud"
	"dbcloud/runtime/local/pgbouncer"
	"dbcloud/runtime/local/postgres"
)

// The connection pooler of a service or read replica set: its PgBouncer
// (runtime/local/pgbouncer) in DATA/services/<id>/pooler.

func (rt *Runtime) poolerDir(serviceID string) string {
	return filepath.Join(rt.serviceDir(serviceID), "pooler")
}

// ensurePooler makes the service's pooler match its spec. With the pooler
// enabled and the service running, it runs PgBouncer in front of target
// (with the lookup role and function installed on source, the primary) on
// the claimed port and returns the endpoint once it serves TLS there.
// Otherwise it stops and removes the pooler and returns nil.
func (rt *Runtime) ensurePooler(ctx context.Context, svc *dbcloud.Service, target, source postgres.Spec, port int) (*dbcloud.Endpoint, error) {
	if !svc.Spec.Pooler || !svc.Spec.Running {
		return nil, rt.stopPooler(ctx, svc.ID)
	}
	if svc.Endpoint == nil {
		return nil, dbcloud.Terminal(fmt.Errorf("service %s has no endpoint", svc.ID))
	}
	if port < 1 || port > 65535 {
		return nil, dbcloud.Terminal(fmt.Errorf("service %s has no pooler port (%d)", svc.ID, port))
	}
	if !rt.poolers.Available() {
		// One started before (by an older PgBouncer, say) must not go on.
		if err := rt.stopPooler(ctx, svc.ID); err != nil {
			return nil, err
		}
		return nil, dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindUnavailable,
			"The connection pooler (PgBouncer %d.%d or newer) is not installed on this server; disable the pooler or ask the operator to install it (scripts/deps.sh).",
			pgbouncer.MinMajor, pgbouncer.MinMinor))
	}
	p := pgbouncer.Spec{
		ID: svc.ID + "-pooler", Dir: rt.poolerDir(svc.ID),
		ListenAddr: rt.listenAddr(), Port: port, Host: svc.Endpoint.Host, Target: target,
	}
	if err := rt.poolers.Ensure(ctx, p, source); err != nil {
		if errors.Is(err, pgbouncer.ErrInvalidSpec) {
			return nil, dbcloud.Terminal(fmt.Errorf("pooler of %s: %w", svc.ID, err))
		}
		var taken *pgbouncer.AuthDatabaseTakenError
		if errors.As(err, &taken) {
			return nil, dbcloud.Terminal(fmt.Errorf("%w (%v)", dbcloud.Errorf(dbcloud.KindConflict,
				"This service has a database named %q, which dbcloud reserves for its connection pooler's sign-in lookup; rename it (ALTER DATABASE %[1]s RENAME TO ...), then enable the pooler again.",
				postgres.PoolerDatabase), err))
		}
		return nil, fmt.Errorf("pooler of %s: %w", svc.ID, err)
	}
	return &dbcloud.Endpoint{Host: svc.Endpoint.Host, Port: port}, nil
}

// poolerRunning reports whether the service's pooler process is alive, for
// health checks.
func (rt *Runtime) poolerRunning(serviceID string) bool {
	_, ok := rt.poolers.PID(rt.poolerDir(serviceID))
	return ok
}

// stopPooler stops the service's PgBouncer and removes its files and
// cgroup. It is idempotent.
func (rt *Runtime) stopPooler(ctx context.Context, serviceID string) error {
	if err := rt.poolers.Stop(ctx, serviceID+"-pooler", rt.poolerDir(serviceID)); err != nil {
		return fmt.Errorf("stop pooler of %s: %w", serviceID, err)
	}
	return nil
}
