package engine

import (
	"context"
	"time"

	"dbcloud"
)

// The idle clock of auto-pause (decisions.md section 10): the health loop
// counts each READY auto-pause service's client sessions every round
// (the runtime's Observation.Sessions); one with none, and no operation
// pending, for its idle_seconds is paused as a stop would be, by an
// auto_pause operation of dbcloud's own. Auto-paused services are handed
// to the runtime's Waker every round, which keeps their endpoints
// listening (also after a restart of dbcloud).

// idleFor is how long one idle second of a setting lasts: a second,
// unless a test shortens the clock (IdleUnit).
func (e *Engine) idleFor(svc *dbcloud.Service) time.Duration {
	unit := e.IdleUnit
	if unit <= 0 {
		unit = time.Second
	}
	return time.Duration(svc.AutoPause.IdleSeconds) * unit
}

// observeIdle runs the idle clock of a READY service on what its check
// saw, and pauses it when the clock has run out.
func (e *Engine) observeIdle(ctx context.Context, svc *dbcloud.Service, obs *dbcloud.Observation) {
	if svc.AutoPause == nil || obs.Sessions == nil {
		return
	}
	now := e.now()
	e.mu.Lock()
	since, seen := e.idleSince[svc.ID]
	if !seen || *obs.Sessions > 0 {
		// A client now, or the first look (after a start, a wake or a
		// restart of dbcloud): the clock starts again.
		e.idleSince[svc.ID] = now
	}
	e.mu.Unlock()
	if !seen || *obs.Sessions > 0 || now.Sub(since) < e.idleFor(svc) {
		return
	}
	if err := e.autoPause(ctx, svc, now); err != nil && ctx.Err() == nil {
		e.Logger.Warn("auto-pause", "service", svc.ID, "error", err)
	}
}

// forgetIdle drops the idle clocks of services no longer watched with
// auto-pause: each starts again from its next READY look.
func (e *Engine) forgetIdle(watched []*dbcloud.Service) {
	keep := make(map[string]bool, len(watched))
	for _, s := range watched {
		if s.AutoPause != nil && s.Status == dbcloud.StatusReady {
			keep[s.ID] = true
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for id := range e.idleSince {
		if !keep[id] {
			delete(e.idleSince, id)
		}
	}
}

// autoPause records the pause of an idle service: READY -> PAUSING with
// an auto_pause operation by dbcloud, in one transaction that holds the
// project's lock as the service layer's changes do, and only if nothing
// changed since it was seen idle.
func (e *Engine) autoPause(ctx context.Context, seen *dbcloud.Service, now time.Time) error {
	paused := false
	err := e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if err := tx.LockProject(seen.ProjectID); err != nil {
			return err
		}
		s, err := tx.FindService(seen.ProjectID, seen.ID)
		if dbcloud.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		if s.Generation != seen.Generation || s.AutoPause == nil || !s.Spec.Running || !dbcloud.AutoPauseIdle.Allows(s.Status) {
			return nil
		}
		pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: s.ID, Pending: true, Limit: 1})
		if err != nil || len(pending) > 0 {
			return err
		}
		s.Spec.Running, s.PausedAt = false, &now
		dbcloud.AutoPauseIdle.Apply(s)
		s.Generation++
		op := &dbcloud.Operation{
			ID: dbcloud.NewID(), ProjectID: s.ProjectID, ResourceID: s.ID, Type: dbcloud.OpAutoPause, Generation: s.Generation,
			State: dbcloud.OpPending, Created: now, Updated: now, RequestedBy: dbcloud.Requester{System: "dbcloud"},
		}
		if err := tx.InsertOperation(op); err != nil {
			return err
		}
		paused = true
		return tx.UpdateService(s)
	})
	if paused {
		e.Logger.Info("service idle; pausing it", "service", seen.ID, "idle_seconds", seen.AutoPause.IdleSeconds)
		e.mu.Lock()
		delete(e.idleSince, seen.ID)
		e.mu.Unlock()
		e.Notify()
	}
	return err
}

// holdPausedAtOpen holds the auto-paused services' endpoints before Open
// returns, and so before the API answers after a restart of dbcloud: a
// client that reads a service as PAUSED, or any other answer of the new
// process, and then connects to it, wakes it rather than being refused.
// The health loop's first round, a goroutine, came too late for that.
// The list it reads is the health loop's first (watchedNow).
func (e *Engine) holdPausedAtOpen(ctx context.Context) {
	if dbcloud.CapabilitiesOf(e.Provisioner).Waker == nil {
		return
	}
	w, err := e.watchedNow(ctx)
	if err != nil {
		e.Logger.Warn("list auto-paused services to hold their endpoints", "error", err)
		return
	}
	e.holdPaused(ctx, w.paused)
}

// holdPaused hands every auto-paused service to the runtime's Waker,
// which keeps (or, after a restart, opens again) its endpoints.
func (e *Engine) holdPaused(ctx context.Context, paused []*dbcloud.Service) {
	w := dbcloud.CapabilitiesOf(e.Provisioner).Waker
	if w == nil {
		return
	}
	for _, svc := range paused {
		e.guard("hold paused service", svc.ID, func() {
			if err := w.HoldPaused(ctx, svc); err != nil && ctx.Err() == nil {
				e.Logger.Warn("keep the endpoints of an auto-paused service", "service", svc.ID, "error", err)
			}
		})
	}
}

// waking reports whether the service is being woken by a client and by
// nothing else: RESUMING with only wake operations pending.
func (e *Engine) waking(ctx context.Context, svc *dbcloud.Service) (bool, error) {
	if svc.Status != dbcloud.Wake.Through {
		return false, nil
	}
	var ops []*dbcloud.Operation
	err := e.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		ops, err = tx.ListOperations(dbcloud.OperationFilter{ResourceID: svc.ID, Pending: true})
		return err
	})
	if err != nil {
		return false, err
	}
	for _, op := range ops {
		if op.Type != dbcloud.OpWake {
			return false, nil
		}
	}
	return len(ops) > 0, nil
}

// wakeFailed undoes a wake whose start failed (a full disk, say): nobody
// but a client's connection asked for it, and that client has been told
// why, so the service goes back to PAUSED, auto-paused, its endpoints
// listening again, rather than retrying a start nobody waits for and
// ending UNSTABLE. The next connection wakes it again, once the cause is
// gone. The runtime is asked first (it stops whatever started and holds
// the endpoints again, under the next generation); a service changed
// meanwhile is left to that change. If even that fails, the wake is
// retried as any failed change is.
func (e *Engine) wakeFailed(ctx context.Context, svc *dbcloud.Service, cause error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	now := e.now()
	gen := svc.Generation
	paused := *svc
	paused.Spec.Running, paused.PausedAt, paused.Generation = false, &now, gen+1
	obs, err := e.Provisioner.EnsureService(ctx, &paused)
	if err != nil {
		e.Logger.Warn("pause a service again after its wake failed", "service", svc.ID, "error", err)
		return failed(ctx, e, serviceKind, svc, cause)
	}
	e.clearBackoff(svc.ID)
	reason := reasonOf(cause)
	e.Logger.Warn("wake failed; service paused again", "service", svc.ID, "error", cause)
	return e.updateService(ctx, svc, func(s *dbcloud.Service) bool {
		if !serviceKind.at(s, gen, string(dbcloud.Wake.Through)) {
			return false
		}
		s.Spec.Running, s.PausedAt, s.Generation, s.ObservedGeneration = false, &now, gen+1, gen+1
		s.Status, s.StatusReason = dbcloud.StatusPaused, "Its last wake failed: "+reason
		s.Instances, s.PoolerEndpoint = obs.Instances, obs.PoolerEndpoint
		return true
	}, func(tx dbcloud.Tx) error {
		return finishOperationsTx(tx, svc.ID, gen, dbcloud.OpFailed, reason, e.now())
	})
}
