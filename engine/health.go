package engine

import (
	"context"
	"errors"
	"slices"
	"time"

	"dbcloud/internal/supervise"

	"dbcloud"
)

// healthLoop checks every service that should be running and every read
// replica set that has no work pending: a primary (or node) that died is
// shown UNSTABLE (error) and restarted at once, and usage is written to the
// store every MetricsInterval. The first round runs at once, so that a
// service that died while dbcloud was down is seen without waiting an
// interval.
func (e *Engine) healthLoop(ctx context.Context) {
	e.healthRound(ctx)
	every(ctx, e.HealthInterval, func() { e.healthRound(ctx) })
}

// healthRound checks every watched resource once.
func (e *Engine) healthRound(ctx context.Context) {
	w, err := e.watchedNow(ctx)
	if err != nil {
		if ctx.Err() == nil {
			e.Logger.Warn("list resources for health checks", "error", err)
		}
		return
	}
	// Paused services' endpoints first: holding them is a listen each,
	// while the checks below can take seconds at many services, and after
	// a restart a client of a paused service is refused until its
	// endpoint is held again.
	e.holdPaused(ctx, w.paused)
	due := e.metricsDue(w.services)
	var measured []measurement
	for _, svc := range w.services {
		e.guard("health check", svc.ID, func() {
			if obs := e.check(ctx, svc, due[svc.ID]); obs != nil {
				measured = append(measured, measurement{svc, obs})
			}
		})
	}
	e.forgetIdle(w.services)
	e.recordMetrics(ctx, measured)
	var samples []dbcloud.SeriesSample
	for _, m := range measured {
		samples = append(samples, dbcloud.Samples(m.svc, m.obs.Metrics)...)
	}
	e.recordHistory(ctx, samples)
	if rp, ok := e.replicaSets(); ok {
		for i, set := range w.sets {
			e.guard("replica set health check", set.ID, func() { e.checkReplicaSet(ctx, rp, w.parents[i], set) })
		}
	}
}

// watched are the resources the health loop checks.
type watched struct {
	services []*dbcloud.Service
	sets     []*dbcloud.ReadReplicaSet
	parents  []*dbcloud.Service // of sets, by index
	// paused are the auto-paused services (autopause.go).
	paused []*dbcloud.Service
}

// watchList is the health loop's last list of the resources it watches,
// when it was read and lastChange then. Only the health loop uses it.
type watchList struct {
	w      *watched
	at     time.Time
	change int64
}

// watchedNow returns the resources to check this round: the last list
// again, unless a worker of this process began or ended work since it was
// read, or it is MetricsInterval old. Reading it decodes every service of
// every project, parked ones too: tens of milliseconds at 2,000 services,
// every second, most of an idle control plane's CPU. What another control
// plane changed is seen within MetricsInterval; until then a check of a
// service changed meanwhile is harmless: a repair reads it again under its
// lease (stillBroken), and usage is written only over the generation that
// was measured (recordMetrics).
func (e *Engine) watchedNow(ctx context.Context) (*watched, error) {
	change, now := e.lastChange.Load(), time.Now()
	if c := e.watchList; c.w != nil && c.change == change && now.Sub(c.at) < e.MetricsInterval {
		return c.w, nil
	}
	w, err := e.settled(ctx)
	if err != nil {
		return nil, err
	}
	e.watchList = watchList{w: w, at: now, change: change}
	return w, nil
}

// settled lists the resources the health loop watches: services that
// should run and read replica sets that are active or failed, with no
// operation pending.
func (e *Engine) settled(ctx context.Context) (*watched, error) {
	out := &watched{}
	err := e.Store.View(ctx, func(tx dbcloud.Tx) error {
		projects, err := tx.ListProjects()
		if err != nil {
			return err
		}
		pending, err := tx.ListOperations(dbcloud.OperationFilter{Pending: true})
		if err != nil {
			return err
		}
		busy := map[string]bool{}
		for _, op := range pending {
			busy[op.ResourceID] = true
		}
		for _, p := range projects {
			svcs, err := tx.ListServices(p.ID)
			if err != nil {
				return err
			}
			byID := map[string]*dbcloud.Service{}
			for _, s := range svcs {
				byID[s.ID] = s
				if s.Spec.Running && !busy[s.ID] && (s.Status == dbcloud.StatusReady || s.Status == dbcloud.StatusUnstable) {
					out.services = append(out.services, s)
				}
				if s.AutoPaused() && !busy[s.ID] && s.Status == dbcloud.StatusPaused {
					out.paused = append(out.paused, s)
				}
			}
			sets, err := tx.ListReplicaSets(p.ID, "")
			if err != nil {
				return err
			}
			for _, r := range sets {
				parent := byID[r.ServiceID]
				if parent != nil && !busy[r.ID] && (r.Status == dbcloud.ReplicaSetActive || r.Status == dbcloud.ReplicaSetError) {
					out.sets = append(out.sets, r)
					out.parents = append(out.parents, parent)
				}
			}
		}
		return nil
	})
	return out, err
}

// claimForRepair marks a resource as worked on by this process, unless it
// already is, is backing off, or was given up on a short while ago; while
// marked, the dispatcher leaves it alone.
func (e *Engine) claimForRepair(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	if e.active[id] || now.Before(e.notBefore[id]) || now.Before(e.repairAfter[id]) {
		return false
	}
	e.active[id] = true
	return true
}

// endRepair ends claimForRepair's mark; work that arrived meanwhile is
// dispatched at once.
func (e *Engine) endRepair(id string) {
	e.mu.Lock()
	delete(e.active, id)
	e.mu.Unlock()
	e.Notify()
}

// measurement is a READY service's usage, measured by its check.
type measurement struct {
	svc *dbcloud.Service
	obs *dbcloud.Observation
}

// metricsDue picks the services whose usage this round measures: those
// not measured for MetricsInterval, the longest unmeasured first, but no
// more than their share of a MetricsInterval's rounds (and at least one),
// so that services made together are measured over the interval rather
// than all in one round, which would show as a burst of the loop's CPU
// and of the API's latency every interval.
func (e *Engine) metricsDue(svcs []*dbcloud.Service) map[string]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	var due []*dbcloud.Service
	for _, svc := range svcs {
		if now.Sub(e.measured[svc.ID]) >= e.MetricsInterval {
			due = append(due, svc)
		}
	}
	rounds := max(1, int(e.MetricsInterval/max(e.HealthInterval, 1)))
	budget := (len(svcs) + rounds - 1) / rounds
	if len(due) > budget {
		slices.SortStableFunc(due, func(a, b *dbcloud.Service) int { return e.measured[a.ID].Compare(e.measured[b.ID]) })
		due = due[:budget]
	}
	out := make(map[string]bool, len(due))
	for _, svc := range due {
		out[svc.ID] = true
	}
	return out
}

// check checks one service, measuring its usage if due, and returns the
// observation when it holds usage to record (nil when none was due or the
// service is not READY).
func (e *Engine) check(ctx context.Context, svc *dbcloud.Service, due bool) *dbcloud.Observation {
	if !e.claimForRepair(svc.ID) {
		return nil
	}
	defer e.endRepair(svc.ID)
	return e.checkClaimed(ctx, svc, due)
}

// checkClaimed is check once the service is claimed for repair.
func (e *Engine) checkClaimed(ctx context.Context, svc *dbcloud.Service, due bool) *dbcloud.Observation {
	obs, err := e.Provisioner.CheckService(ctx, svc, due)
	if err != nil {
		if ctx.Err() == nil {
			e.Logger.Warn("check service", "service", svc.ID, "error", err)
		}
		return nil
	}
	if obs.Running && svc.Status == dbcloud.StatusReady {
		e.observeIdle(ctx, svc, obs)
		if due && obs.Metrics != nil {
			if obs.Metrics.Measured.IsZero() {
				obs.Metrics.Measured = e.now() // the history needs a time
			}
			e.mu.Lock()
			e.measured[svc.ID] = e.now()
			e.mu.Unlock()
			return obs
		}
		return nil
	}
	// Not running (or UNSTABLE): repair under the lease, as any change.
	e.repair(ctx, svc, obs)
	return nil
}

// repair shows the service UNSTABLE and reconciles it back to READY.
func (e *Engine) repair(ctx context.Context, svc *dbcloud.Service, obs *dbcloud.Observation) {
	lctx, release, ok := e.lease(ctx, svc.ID, nil)
	if !ok {
		return
	}
	defer release()
	// What was seen before the lease may be stale: another plane may have
	// changed or repaired the service meanwhile. Look again under the
	// lease, so only a service still broken is repaired, by one plane.
	if svc, obs, ok = e.stillBroken(lctx, svc); !ok {
		return
	}
	gen := svc.Generation
	began, reason := e.now(), svc.StatusReason
	wasPrimary := primaryID(svc.Instances)
	if svc.Status == dbcloud.StatusReady {
		reason = obs.Reason
		if reason == "" {
			reason = "The primary stopped unexpectedly; restarting it."
		}
	}
	ensure := func() (*dbcloud.Observation, error) {
		start := time.Now()
		fixed, err := e.Provisioner.EnsureService(lctx, svc)
		if e.Observe != nil && lctx.Err() == nil {
			e.Observe("repair", time.Since(start), err)
		}
		return fixed, err
	}
	show := func(s *dbcloud.Service, fixed *dbcloud.Observation) {
		settleStatus(s, fixed)
		s.Instances = fixed.Instances
		s.PoolerEndpoint = fixed.PoolerEndpoint
		if fixed.Endpoint != nil {
			s.Endpoint = fixed.Endpoint
		}
	}
	record := func(tx dbcloud.Tx, fixed *dbcloud.Observation) error {
		// Runs before show: record the repair only if show will show READY.
		s, err := tx.FindService(svc.ProjectID, svc.ID)
		if err != nil || s.Generation != gen || s.Status != dbcloud.StatusUnstable || !fixed.Running || !s.Spec.Running {
			return nil
		}
		isPrimary := primaryID(fixed.Instances)
		return repairOperation(tx, s, wasPrimary != "" && isPrimary != "" && wasPrimary != isPrimary, reason, began, e.now())
	}
	restore(lctx, e, serviceKind, svc, reason, ensure, show, record, func(err error) {
		// A cause the user can act on (a full disk) replaces the
		// generic reason, so status_reason says why it stays down.
		var de *dbcloud.Error
		if errors.As(err, &de) && de.Kind != dbcloud.KindInternal {
			e.updateService(lctx, svc, func(s *dbcloud.Service) bool {
				if s.Generation != gen || s.Status != dbcloud.StatusUnstable || s.StatusReason == de.Message {
					return false
				}
				s.StatusReason = de.Message
				return true
			}, nil)
		}
	})
}

// recordMetrics writes the usage of a round's services in one store
// transaction (three per service, with the lease's, were a large part of
// the loop's CPU at hundreds of services). Each is written under its lease,
// taken and given back inside the transaction, so that with several
// control planes one writes it, and never over a plane that holds the
// lease for a change (which writes usage as part of that change's work).
func (e *Engine) recordMetrics(ctx context.Context, ms []measurement) {
	if len(ms) == 0 {
		return
	}
	now := e.now()
	err := e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		for _, m := range ms {
			ok, err := tx.AcquireLease(m.svc.ID, e.Owner, now, now.Add(e.LeaseTTL))
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			s, err := tx.FindService(m.svc.ProjectID, m.svc.ID)
			if err != nil && !dbcloud.IsNotFound(err) {
				return err
			}
			if err == nil && s.Generation == m.svc.Generation {
				s.Metrics = m.obs.Metrics
				showNotice(s, m.obs.Notice)
				if err := tx.UpdateService(s); err != nil {
					return err
				}
			}
			if err := tx.ReleaseLease(m.svc.ID, e.Owner); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		e.Logger.Warn("record metrics", "services", len(ms), "error", err)
	}
}

// stillBroken reads the service again, and checks it again, while its
// lease is held: it reports the fresh service and observation when the
// service still needs a repair, and false when it changed (a new
// operation, another generation) or runs healthily again.
func (e *Engine) stillBroken(ctx context.Context, seen *dbcloud.Service) (*dbcloud.Service, *dbcloud.Observation, bool) {
	var svc *dbcloud.Service
	var pending bool
	err := e.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		if svc, err = tx.FindService(seen.ProjectID, seen.ID); err != nil {
			return err
		}
		ops, err := tx.ListOperations(dbcloud.OperationFilter{Pending: true, ResourceID: seen.ID})
		pending = len(ops) > 0
		return err
	})
	if err != nil || pending || svc.Generation != seen.Generation || !svc.Spec.Running ||
		(svc.Status != dbcloud.StatusReady && svc.Status != dbcloud.StatusUnstable) {
		return nil, nil, false
	}
	obs, err := e.Provisioner.CheckService(ctx, svc, false)
	if err != nil || (obs.Running && svc.Status == dbcloud.StatusReady) {
		return nil, nil, false
	}
	return svc, obs, true
}

// failureNoticed is the runtime's notice (dbcloud.FailureWatcher) that a
// service failed: the service is checked now, as a health round would,
// rather than at the next round. A worker or a check of this process may
// hold the service at the moment (one begun just before the failure would
// miss it): the check waits for it, a short while, then leaves the service
// to the health loop.
func (e *Engine) failureNoticed(ctx context.Context, projectID, serviceID string) {
	if ctx.Err() != nil {
		return
	}
	e.Logger.Info("service failure noticed; checking it now", "service", serviceID)
	e.group.Go(supervise.Task{Name: "failure check", Attrs: []any{"service", serviceID}}, func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for deadline := time.Now().Add(e.LeaseTTL); time.Now().Before(deadline); {
			svc, ok := e.watchedService(ctx, projectID, serviceID)
			if !ok {
				return // gone, stopped, or with work pending: its worker ensures it
			}
			if e.checkFailed(ctx, svc) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

// checkFailed checks svc as the health loop does, reporting false when
// this process was busy with it (nothing was checked).
func (e *Engine) checkFailed(ctx context.Context, svc *dbcloud.Service) bool {
	if !e.claimForRepair(svc.ID) {
		return false
	}
	defer e.endRepair(svc.ID)
	e.checkClaimed(ctx, svc, false)
	return true
}

// watchedService reads the service if the health loop would check it:
// it should run, has no operation pending and is READY or UNSTABLE.
func (e *Engine) watchedService(ctx context.Context, projectID, id string) (*dbcloud.Service, bool) {
	var svc *dbcloud.Service
	var pending bool
	err := e.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		if svc, err = tx.FindService(projectID, id); err != nil {
			return err
		}
		ops, err := tx.ListOperations(dbcloud.OperationFilter{Pending: true, ResourceID: id})
		pending = len(ops) > 0
		return err
	})
	if err != nil || pending || !svc.Spec.Running ||
		(svc.Status != dbcloud.StatusReady && svc.Status != dbcloud.StatusUnstable) {
		return nil, false
	}
	return svc, true
}
