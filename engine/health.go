package engine

import (
	"context"
	"time"

	"dbcloud"
)

// healthLoop checks every service that should be running and has no work
// pending: a primary that died is shown UNSTABLE and restarted at once, and
// usage is written to the store every MetricsInterval.
func (e *Engine) healthLoop(ctx context.Context) {
	defer e.wg.Done()
	t := time.NewTicker(e.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		svcs, err := e.settledServices(ctx)
		if err != nil {
			if ctx.Err() == nil {
				e.Logger.Warn("list services for health checks", "error", err)
			}
			continue
		}
		for _, svc := range svcs {
			e.check(ctx, svc)
		}
	}
}

// settledServices lists the services the health loop watches: running, no
// operation pending, not being worked on here.
func (e *Engine) settledServices(ctx context.Context) ([]*dbcloud.Service, error) {
	var out []*dbcloud.Service
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
			for _, s := range svcs {
				if s.Spec.Running && !busy[s.ID] && (s.Status == dbcloud.StatusReady || s.Status == dbcloud.StatusUnstable) {
					out = append(out, s)
				}
			}
		}
		return nil
	})
	return out, err
}

func (e *Engine) check(ctx context.Context, svc *dbcloud.Service) {
	e.mu.Lock()
	busy := e.active[svc.ID] || e.now().Before(e.notBefore[svc.ID]) || e.now().Before(e.repairAfter[svc.ID])
	due := e.now().Sub(e.measured[svc.ID]) >= e.MetricsInterval
	e.mu.Unlock()
	if busy {
		return
	}
	obs, err := e.Provisioner.CheckService(ctx, svc, due)
	if err != nil {
		if ctx.Err() == nil {
			e.Logger.Warn("check service", "service", svc.ID, "error", err)
		}
		return
	}
	if obs.Running && svc.Status == dbcloud.StatusReady {
		if due && obs.Metrics != nil {
			e.mu.Lock()
			e.measured[svc.ID] = e.now()
			e.mu.Unlock()
			if err := e.updateService(ctx, svc, func(s *dbcloud.Service) bool {
				if s.Generation != svc.Generation {
					return false
				}
				s.Metrics = obs.Metrics
				return true
			}, nil); err != nil && ctx.Err() == nil {
				e.Logger.Warn("record metrics", "service", svc.ID, "error", err)
			}
		}
		return
	}
	// Not running (or UNSTABLE): repair under the lease, as any change.
	e.repair(ctx, svc, obs)
}

// repair shows the service UNSTABLE and reconciles it back to READY.
func (e *Engine) repair(ctx context.Context, svc *dbcloud.Service, obs *dbcloud.Observation) {
	e.mu.Lock()
	if e.active[svc.ID] {
		e.mu.Unlock()
		return
	}
	e.active[svc.ID] = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.active, svc.ID)
		e.mu.Unlock()
	}()
	lctx, release, ok := e.lease(ctx, svc.ID)
	if !ok {
		return
	}
	defer release()
	gen := svc.Generation
	if svc.Status == dbcloud.StatusReady {
		reason := obs.Reason
		if reason == "" {
			reason = "The primary stopped unexpectedly; restarting it."
		}
		if err := e.updateService(lctx, svc, func(s *dbcloud.Service) bool {
			if s.Generation != gen || s.Status != dbcloud.StatusReady {
				return false
			}
			s.Status, s.StatusReason = dbcloud.StatusUnstable, reason
			return true
		}, nil); err != nil {
			return
		}
		e.Logger.Warn("service unhealthy", "service", svc.ID, "reason", reason)
	}
	fixed, err := e.Provisioner.EnsureService(lctx, svc)
	if err != nil {
		if lctx.Err() == nil {
			e.backoff(svc.ID, 1)
			e.Logger.Warn("repair failed; retrying", "service", svc.ID, "error", err)
		}
		return
	}
	e.updateService(lctx, svc, func(s *dbcloud.Service) bool {
		if s.Generation != gen || s.Status != dbcloud.StatusUnstable {
			return false
		}
		s.Status, s.StatusReason = settled(s, fixed)
		s.Instances = fixed.Instances
		s.PoolerEndpoint = fixed.PoolerEndpoint
		return true
	}, nil)
}
