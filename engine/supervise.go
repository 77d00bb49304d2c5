package engine

import (
	"context"
	"errors"
	"fmt"

	"dbcloud"
	"dbcloud/internal/supervise"
)

// A panic in the engine's goroutines (most likely in a runtime it calls)
// must cost the resource it hit one failed attempt, not the process that
// serves every tenant: the loops run under a supervise.Group, and each
// resource's part of a round under supervise.Call.

// reconcileSafely is reconcile with a panic in it logged with the resource
// and recorded as a failed, retryable attempt of that resource, through
// its kind's own failure path: a service backs off and is given up on
// after MaxAttempts as for any error.
func (e *Engine) reconcileSafely(ctx context.Context, kind string, svc *dbcloud.Service, projectID, id string) error {
	err := supervise.Call(func() error { return e.reconcile(ctx, kind, svc, projectID, id) })
	var p *supervise.PanicError
	if !errors.As(err, &p) {
		return err
	}
	supervise.Log(e.Logger, "reconcile", p, "resource", id, "kind", kind)
	cause := fmt.Errorf("reconcile of %s %s: %w", kind, id, p)
	switch kind {
	case "service":
		if svc != nil {
			return failed(ctx, e, serviceKind, svc, cause)
		}
	case "peering":
		if _, peering, err := e.findPeering(ctx, projectID, id); err == nil && peering != nil {
			return e.peeringFailed(ctx, peering, cause)
		}
	case "replica_set":
		if set, _, err := e.loadReplicaSet(ctx, projectID, id); err == nil && set != nil {
			return failed(ctx, e, replicaSetKind, set, cause)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	_, err = e.attemptFailed(ctx, id, cause)
	return err
}

// reconcile runs the reconciler of the resource's kind.
func (e *Engine) reconcile(ctx context.Context, kind string, svc *dbcloud.Service, projectID, id string) error {
	switch kind {
	case "service":
		return e.reconcileService(ctx, svc, id)
	case "peering":
		return e.reconcilePeering(ctx, projectID, id)
	case "replica_set":
		return e.reconcileReplicaSet(ctx, projectID, id)
	}
	return nil
}

// guard runs one resource's part of a loop's round (a health check, a
// backup round): a panic in it is logged with the resource, which backs
// off as after a failure, and the round goes on with the others.
func (e *Engine) guard(task, id string, fn func()) {
	p, ok := supervise.Call(func() error { fn(); return nil }).(*supervise.PanicError)
	if !ok {
		return
	}
	supervise.Log(e.Logger, task, p, "resource", id)
	e.backoff(id, 1)
}
