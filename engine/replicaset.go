package engine

import (
	"context"

	"dbcloud"
)

// Read replica sets are reconciled like services (level-triggered, under
// the set's own lease), by a provisioner that implements
// dbcloud.ReplicaSetProvisioner. Their parent is read fresh every time:
// the set follows wherever the parent's primary is now.

func (e *Engine) replicaSets() (dbcloud.ReplicaSetProvisioner, bool) {
	rp := dbcloud.CapabilitiesOf(e.Provisioner).ReplicaSets
	return rp, rp != nil
}

// replicaSetKind is how the engine's shared flow (resource.go) reads and
// shows a read replica set.
var replicaSetKind = &kind[dbcloud.ReadReplicaSet]{
	name: "read replica set", attr: "replica_set",
	ref: func(r *dbcloud.ReadReplicaSet) (string, string, int64) {
		return r.ProjectID, r.ID, r.Generation
	},
	status: func(r *dbcloud.ReadReplicaSet) (string, string) {
		return string(r.Status), r.StatusReason
	},
	setStatus: func(r *dbcloud.ReadReplicaSet, status, reason string) {
		r.Status, r.StatusReason = dbcloud.ReplicaSetStatus(status), reason
	},
	ready: string(dbcloud.ReplicaSetActive), broken: string(dbcloud.ReplicaSetError),
	deleting: string(dbcloud.ReplicaSetDeleting),
	find:     dbcloud.Tx.FindReplicaSet,
	save:     dbcloud.Tx.UpdateReplicaSet,
	remove:   dbcloud.Tx.DeleteReplicaSet,
}

// reconcileReplicaSet makes one read replica set match its spec.
func (e *Engine) reconcileReplicaSet(ctx context.Context, projectID, id string) error {
	rp, ok := e.replicaSets()
	if !ok {
		return nil
	}
	set, parent, err := e.loadReplicaSet(ctx, projectID, id)
	if err != nil {
		return err
	}
	if set == nil {
		return e.finishOperations(ctx, id, 0, dbcloud.OpSucceeded, "")
	}
	if set.Status == dbcloud.ReplicaSetDeleting {
		return remove(ctx, e, replicaSetKind, set, func() error { return rp.DeleteReplicaSet(ctx, parent, set) })
	}
	if parent == nil {
		return failed(ctx, e, replicaSetKind, set, dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindInvalid,
			"The service %s of this read replica set no longer exists.", set.ServiceID)))
	}
	ensure := func() (*dbcloud.Observation, error) { return rp.EnsureReplicaSet(ctx, parent, set) }
	return settle(ctx, e, replicaSetKind, set, ensure, showReplicaSet)
}

// showReplicaSet shows what runs of a set, and its settled status if gen
// is still the newest.
func showReplicaSet(r *dbcloud.ReadReplicaSet, obs *dbcloud.Observation, gen int64) {
	r.ObservedGeneration = max(r.ObservedGeneration, gen)
	r.PoolerEndpoint = obs.PoolerEndpoint
	if obs.Endpoint != nil {
		r.Endpoint = obs.Endpoint
	}
	if r.Generation == gen && r.Status != dbcloud.ReplicaSetDeleting {
		r.Status, r.StatusReason = replicaSetSettled(obs)
	}
}

// replicaSetSettled is the status of a set whose spec is fully real.
func replicaSetSettled(obs *dbcloud.Observation) (dbcloud.ReplicaSetStatus, string) {
	if obs.Running {
		return dbcloud.ReplicaSetActive, ""
	}
	return dbcloud.ReplicaSetError, obs.Reason
}

// loadReplicaSet returns the set and its parent service; nil for either
// that does not exist.
func (e *Engine) loadReplicaSet(ctx context.Context, projectID, id string) (*dbcloud.ReadReplicaSet, *dbcloud.Service, error) {
	var (
		set    *dbcloud.ReadReplicaSet
		parent *dbcloud.Service
	)
	err := e.Store.View(ctx, func(tx dbcloud.Tx) error {
		r, err := tx.FindReplicaSet(projectID, id)
		if dbcloud.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		set = r
		s, err := tx.FindService(projectID, r.ServiceID)
		if dbcloud.IsNotFound(err) {
			return nil
		}
		parent = s
		return err
	})
	return set, parent, err
}

// updateReplicaSet is update (resource.go) for a read replica set.
func (e *Engine) updateReplicaSet(ctx context.Context, set *dbcloud.ReadReplicaSet, fn func(r *dbcloud.ReadReplicaSet) bool, then func(tx dbcloud.Tx) error) error {
	return update(ctx, e, replicaSetKind, set, fn, then)
}

// checkReplicaSet is check for a read replica set: a node that died, or a
// parent whose primary moved, shows the set as error until it is repaired.
func (e *Engine) checkReplicaSet(ctx context.Context, rp dbcloud.ReplicaSetProvisioner, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) {
	if !e.claimForRepair(set.ID) {
		return
	}
	defer e.endRepair(set.ID)
	obs, err := rp.CheckReplicaSet(ctx, parent, set)
	if err != nil {
		if ctx.Err() == nil {
			e.Logger.Warn("check read replica set", "replica_set", set.ID, "error", err)
		}
		return
	}
	if obs.Running && set.Status == dbcloud.ReplicaSetActive {
		return
	}
	lctx, release, ok := e.lease(ctx, set.ID, nil)
	if !ok {
		return
	}
	defer release()
	// Look again under the lease: another plane may have repaired or
	// changed the set (or its parent) since it was listed.
	fresh, freshParent, err := e.loadReplicaSet(lctx, set.ProjectID, set.ID)
	if err != nil || fresh == nil || freshParent == nil || fresh.Generation != set.Generation ||
		freshParent.Generation != parent.Generation || fresh.Status != set.Status {
		return
	}
	if obs, err = rp.CheckReplicaSet(lctx, parent, set); err != nil || (obs.Running && set.Status == dbcloud.ReplicaSetActive) {
		return
	}
	ensure := func() (*dbcloud.Observation, error) { return rp.EnsureReplicaSet(lctx, parent, set) }
	restore(lctx, e, replicaSetKind, set, obs.Reason, ensure, func(r *dbcloud.ReadReplicaSet, fixed *dbcloud.Observation) {
		r.Status, r.StatusReason = replicaSetSettled(fixed)
		r.PoolerEndpoint = fixed.PoolerEndpoint
		if fixed.Endpoint != nil {
			r.Endpoint = fixed.Endpoint
		}
	}, nil, nil)
}
