package engine

import (
	"context"
	"fmt"
	"time"

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
		return e.deleteReplicaSet(ctx, rp, parent, set)
	}
	if parent == nil {
		return e.replicaSetFailed(ctx, set, dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindInvalid,
			"The service %s of this read replica set no longer exists.", set.ServiceID)))
	}
	gen := set.Generation
	start := time.Now()
	obs, err := rp.EnsureReplicaSet(ctx, parent, set)
	if err != nil {
		return e.replicaSetFailed(ctx, set, err)
	}
	e.clearBackoff(id)
	err = e.updateReplicaSet(ctx, set, func(r *dbcloud.ReadReplicaSet) bool {
		r.ObservedGeneration = max(r.ObservedGeneration, gen)
		r.PoolerEndpoint = obs.PoolerEndpoint
		if obs.Endpoint != nil {
			r.Endpoint = obs.Endpoint
		}
		if r.Generation == gen && r.Status != dbcloud.ReplicaSetDeleting {
			r.Status, r.StatusReason = replicaSetSettled(obs)
		}
		return true
	}, func(tx dbcloud.Tx) error {
		return finishOperationsTx(tx, id, gen, dbcloud.OpSucceeded, "", e.now())
	})
	if err != nil {
		return err
	}
	e.Logger.Info("read replica set reconciled", "replica_set", id, "generation", gen, "running", obs.Running,
		"duration_ms", time.Since(start).Milliseconds())
	return nil
}

// replicaSetSettled is the status of a set whose spec is fully real.
func replicaSetSettled(obs *dbcloud.Observation) (dbcloud.ReplicaSetStatus, string) {
	if obs.Running {
		return dbcloud.ReplicaSetActive, ""
	}
	return dbcloud.ReplicaSetError, obs.Reason
}

// replicaSetFailed is failed for a read replica set: its status becomes
// error with the reason once the engine gives up.
func (e *Engine) replicaSetFailed(ctx context.Context, set *dbcloud.ReadReplicaSet, cause error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	giveUp, err := e.attemptFailed(ctx, set.ID, cause)
	if err != nil || !giveUp {
		return err
	}
	reason := reasonOf(cause)
	gen := set.Generation
	return e.updateReplicaSet(ctx, set, func(r *dbcloud.ReadReplicaSet) bool {
		if r.Status == dbcloud.ReplicaSetDeleting {
			return false
		}
		r.Status, r.StatusReason = dbcloud.ReplicaSetError, reason
		return true
	}, func(tx dbcloud.Tx) error {
		return finishOperationsTx(tx, set.ID, gen, dbcloud.OpFailed, reason, e.now())
	})
}

// deleteReplicaSet removes the set's processes, files and slots, then its
// row and ports.
func (e *Engine) deleteReplicaSet(ctx context.Context, rp dbcloud.ReplicaSetProvisioner, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) error {
	if err := rp.DeleteReplicaSet(ctx, parent, set); err != nil {
		if ctx.Err() == nil {
			attempts, cerr := e.countAttempt(ctx, set.ID, err)
			if cerr != nil {
				return cerr
			}
			e.backoff(set.ID, attempts)
		}
		return fmt.Errorf("delete read replica set %s: %w", set.ID, err)
	}
	e.clearBackoff(set.ID)
	err := e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if err := tx.DeleteReplicaSet(set.ProjectID, set.ID); err != nil && !dbcloud.IsNotFound(err) {
			return err
		}
		if err := tx.ReleasePorts(set.ID); err != nil {
			return err
		}
		return finishOperationsTx(tx, set.ID, 0, dbcloud.OpSucceeded, "", e.now())
	})
	if err == nil {
		e.Logger.Info("read replica set deleted", "replica_set", set.ID)
	}
	return err
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

// updateReplicaSet is updateService for a read replica set.
func (e *Engine) updateReplicaSet(ctx context.Context, set *dbcloud.ReadReplicaSet, fn func(r *dbcloud.ReadReplicaSet) bool, then func(tx dbcloud.Tx) error) error {
	return e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if then != nil {
			if err := then(tx); err != nil {
				return err
			}
		}
		r, err := tx.FindReplicaSet(set.ProjectID, set.ID)
		if dbcloud.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		before := r.Status
		if !fn(r) {
			return nil
		}
		if r.Status != before {
			e.Logger.Info("read replica set status", "replica_set", r.ID, "from", before, "to", r.Status, "reason", r.StatusReason)
		}
		*set = *r
		return tx.UpdateReplicaSet(r)
	})
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
	gen := set.Generation
	if set.Status == dbcloud.ReplicaSetActive {
		if err := e.updateReplicaSet(lctx, set, func(r *dbcloud.ReadReplicaSet) bool {
			if r.Generation != gen || r.Status != dbcloud.ReplicaSetActive {
				return false
			}
			r.Status, r.StatusReason = dbcloud.ReplicaSetError, obs.Reason
			return true
		}, nil); err != nil {
			return
		}
		e.Logger.Warn("read replica set unhealthy", "replica_set", set.ID, "reason", obs.Reason)
	}
	fixed, err := rp.EnsureReplicaSet(lctx, parent, set)
	if err != nil {
		if lctx.Err() == nil {
			e.backoff(set.ID, 1)
			e.Logger.Warn("repair failed; retrying", "replica_set", set.ID, "error", err)
		}
		return
	}
	e.updateReplicaSet(lctx, set, func(r *dbcloud.ReadReplicaSet) bool {
		if r.Generation != gen || r.Status != dbcloud.ReplicaSetError {
			return false
		}
		r.Status, r.StatusReason = replicaSetSettled(fixed)
		r.PoolerEndpoint = fixed.PoolerEndpoint
		if fixed.Endpoint != nil {
			r.Endpoint = fixed.Endpoint
		}
		return true
	}, nil)
}
