package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"dbcloud"
)

// reconcileService makes one service match its spec. Each step records its
// progress, so a crash at any point is recovered by reconciling again.
func (e *Engine) reconcileService(ctx context.Context, svc *dbcloud.Service, id string) error {
	if svc == nil {
		// Gone: whatever was pending for it has nothing left to do.
		return e.finishOperations(ctx, id, 0, dbcloud.OpSucceeded, "")
	}
	if svc.Status == dbcloud.StatusDeleting {
		return e.deleteService(ctx, svc)
	}
	gen := svc.Generation
	start := time.Now()
	if err := e.ensureAttachment(ctx, svc); err != nil {
		return e.failed(ctx, svc, err)
	}
	vpcEndpoint := svc.VPCEndpoint
	obs, err := e.Provisioner.EnsureService(ctx, svc)
	if err != nil {
		return e.failed(ctx, svc, err)
	}
	if obs.Running {
		if err := e.ensureCredentials(ctx, svc); err != nil {
			return e.failed(ctx, svc, err)
		}
	}
	e.clearBackoff(id)
	// Step 2: what was asked is real; show it, unless more was asked since.
	err = e.updateService(ctx, svc, func(s *dbcloud.Service) bool {
		s.ObservedGeneration = max(s.ObservedGeneration, gen)
		s.Instances = obs.Instances
		// The VPC endpoint appears once the service accepts connections there.
		s.VPCEndpoint = vpcEndpoint
		// So does the pooler's, and it goes when the pooler does.
		s.PoolerEndpoint = obs.PoolerEndpoint
		if obs.Endpoint != nil {
			s.Endpoint = obs.Endpoint
		}
		if obs.Metrics != nil {
			s.Metrics = obs.Metrics
		}
		if s.Generation == gen && s.Status != dbcloud.StatusDeleting {
			s.Status, s.StatusReason = settled(s, obs)
		}
		return true
	}, func(tx dbcloud.Tx) error {
		return finishOperationsTx(tx, id, gen, dbcloud.OpSucceeded, "", e.now())
	})
	if err != nil {
		return err
	}
	e.Logger.Info("service reconciled", "service", id, "generation", gen, "running", obs.Running,
		"duration_ms", time.Since(start).Milliseconds())
	return nil
}

// ensureAttachment asks the network for the service's address in the VPC
// its spec names, or releases the one it no longer names. The runtime then
// serves the service at svc.VPCEndpoint; the store learns of it only once
// that works.
func (e *Engine) ensureAttachment(ctx context.Context, svc *dbcloud.Service) error {
	cur := svc.VPCEndpoint
	if cur != nil && cur.VPCID != svc.Spec.VPCID {
		if e.Network == nil {
			return errors.New("no network provider for VPC attachments")
		}
		vpc, err := e.findVPC(ctx, svc.ProjectID, cur.VPCID)
		if err != nil {
			return err
		}
		if vpc != nil {
			if err := e.Network.Detach(ctx, vpc, svc); err != nil {
				return fmt.Errorf("detach %s from VPC %s: %w", svc.ID, vpc.ID, err)
			}
		}
		svc.VPCEndpoint = nil
	}
	if svc.Spec.VPCID == "" || svc.VPCEndpoint != nil {
		return nil
	}
	if e.Network == nil {
		return errors.New("no network provider for VPC attachments")
	}
	vpc, err := e.findVPC(ctx, svc.ProjectID, svc.Spec.VPCID)
	if err != nil {
		return err
	}
	if vpc == nil {
		return dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindInvalid, "VPC %s no longer exists.", svc.Spec.VPCID))
	}
	ep, err := e.Network.Attach(ctx, vpc, svc)
	if err != nil {
		return fmt.Errorf("attach %s to VPC %s: %w", svc.ID, vpc.ID, err)
	}
	svc.VPCEndpoint = ep
	return nil
}

func (e *Engine) findVPC(ctx context.Context, projectID, id string) (*dbcloud.VPC, error) {
	var vpc *dbcloud.VPC
	err := e.Store.View(ctx, func(tx dbcloud.Tx) error {
		v, err := tx.FindVPC(projectID, id)
		if dbcloud.IsNotFound(err) {
			return nil
		}
		vpc = v
		return err
	})
	return vpc, err
}

// settled is the status of a service whose spec is fully real.
func settled(s *dbcloud.Service, obs *dbcloud.Observation) (dbcloud.ServiceStatus, string) {
	switch {
	case !s.Spec.Running:
		return dbcloud.StatusPaused, ""
	case obs.Running:
		return dbcloud.StatusReady, obs.Notice
	}
	return dbcloud.StatusUnstable, obs.Reason
}

// failed records a failed attempt: a retryable error backs off and tries
// again; a terminal one, or too many attempts, fails the operations and
// shows the service UNSTABLE with the reason.
func (e *Engine) failed(ctx context.Context, svc *dbcloud.Service, cause error) error {
	if ctx.Err() != nil {
		return ctx.Err() // lost the lease or shutting down: not the service's fault
	}
	giveUp, err := e.attemptFailed(ctx, svc.ID, cause)
	if err != nil || !giveUp {
		return err
	}
	reason := reasonOf(cause)
	gen := svc.Generation
	return e.updateService(ctx, svc, func(s *dbcloud.Service) bool {
		if s.Status == dbcloud.StatusDeleting {
			return false
		}
		s.Status, s.StatusReason = dbcloud.StatusUnstable, reason
		return true
	}, func(tx dbcloud.Tx) error {
		return finishOperationsTx(tx, svc.ID, gen, dbcloud.OpFailed, reason, e.now())
	})
}

// attemptFailed records a failed attempt on a resource and says whether to
// give up: a retryable error under MaxAttempts backs off instead. Once given
// up, the health loop tries again only after a long pause, so a cause that
// goes away (a full disk freed, say) still heals.
func (e *Engine) attemptFailed(ctx context.Context, id string, cause error) (giveUp bool, err error) {
	attempts, err := e.countAttempt(ctx, id, cause)
	if err != nil {
		return false, err
	}
	if !dbcloud.IsTerminal(cause) && attempts < e.MaxAttempts {
		d := e.backoff(id, attempts)
		e.Logger.Warn("reconcile failed; retrying", "resource", id, "attempt", attempts, "retry_in", d.String(), "error", cause)
		return false, nil
	}
	e.clearBackoff(id)
	e.mu.Lock()
	e.repairAfter[id] = e.now().Add(GiveUpPause)
	e.mu.Unlock()
	e.Logger.Error("reconcile failed; giving up", "resource", id, "attempts", attempts, "error", cause)
	return true, nil
}

// reasonOf is what a client may see of a failure: a domain error's message,
// or a generic text (details stay in the log).
func reasonOf(err error) string {
	var de *dbcloud.Error
	if errors.As(err, &de) && de.Kind != dbcloud.KindInternal {
		return de.Message
	}
	return "Provisioning failed; the operator's logs have the details."
}

// countAttempt records an attempt on the oldest pending operation.
func (e *Engine) countAttempt(ctx context.Context, id string, cause error) (int, error) {
	attempts := 0
	err := e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: id, Pending: true, Limit: 1})
		if err != nil || len(ops) == 0 {
			return err
		}
		op := ops[0]
		op.Attempts++
		op.Error = reasonOf(cause)
		op.Updated = e.now()
		attempts = op.Attempts
		return tx.UpdateOperation(op)
	})
	return attempts, err
}

// deleteService removes the service's processes and files, then its rows.
func (e *Engine) deleteService(ctx context.Context, svc *dbcloud.Service) error {
	svc.Spec.VPCID = ""
	err := e.ensureAttachment(ctx, svc)
	if err == nil {
		err = e.Provisioner.DeleteService(ctx, svc)
	}
	if err != nil {
		if ctx.Err() == nil {
			attempts, cerr := e.countAttempt(ctx, svc.ID, err)
			if cerr != nil {
				return cerr
			}
			e.backoff(svc.ID, attempts)
		}
		return fmt.Errorf("delete service %s: %w", svc.ID, err)
	}
	e.clearBackoff(svc.ID)
	err = e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if err := tx.DeleteService(svc.ProjectID, svc.ID); err != nil && !dbcloud.IsNotFound(err) {
			return err
		}
		if err := deleteCredentialsTx(tx, svc); err != nil {
			return err
		}
		if err := tx.ReleasePorts(svc.ID); err != nil {
			return err
		}
		return finishOperationsTx(tx, svc.ID, 0, dbcloud.OpSucceeded, "", e.now())
	})
	if err == nil {
		e.mu.Lock()
		delete(e.measured, svc.ID)
		e.mu.Unlock()
		e.Logger.Info("service deleted", "service", svc.ID)
		// After a crash here the rows age out with the retention instead.
		if e.History != nil {
			if herr := e.History.Forget(ctx, svc.ID); herr != nil && ctx.Err() == nil {
				e.Logger.Warn("delete metrics history", "service", svc.ID, "error", herr)
			}
		}
	}
	return err
}

// startProvisioning reads the service a worker takes up, in the
// transaction that takes its lease, and shows a queued one CONFIGURING
// (step 1: provisioning has started), reporting whether it did. A service
// that is gone is nil.
func startProvisioning(tx dbcloud.Tx, projectID, id string) (*dbcloud.Service, bool, error) {
	s, err := tx.FindService(projectID, id)
	if dbcloud.IsNotFound(err) {
		return nil, false, nil
	} else if err != nil || !dbcloud.Provision.Allows(s.Status) {
		return s, false, err
	}
	dbcloud.Provision.Apply(s)
	return s, true, tx.UpdateService(s)
}

// updateService re-reads the service inside a write transaction and applies
// fn to the fresh copy, so the engine never overwrites a concurrent request's
// change with a stale one. fn returns false to leave it unchanged. then, if
// not nil, runs in the same transaction: a status and the end of the
// operations that led to it are seen together, so a client that sees READY
// can act at once.
func (e *Engine) updateService(ctx context.Context, svc *dbcloud.Service, fn func(s *dbcloud.Service) bool, then func(tx dbcloud.Tx) error) error {
	return e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if then != nil {
			if err := then(tx); err != nil {
				return err
			}
		}
		s, err := tx.FindService(svc.ProjectID, svc.ID)
		if dbcloud.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		before := s.Status
		if !fn(s) {
			return nil
		}
		if s.Status != before {
			e.Logger.Info("service status", "service", s.ID, "from", before, "to", s.Status, "reason", s.StatusReason)
		}
		*svc = *s
		return tx.UpdateService(s)
	})
}

// finishOperations ends the pending operations of a resource up to
// generation gen (0: all of them).
func (e *Engine) finishOperations(ctx context.Context, id string, gen int64, state dbcloud.OperationState, msg string) error {
	return e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		return finishOperationsTx(tx, id, gen, state, msg, e.now())
	})
}

func finishOperationsTx(tx dbcloud.Tx, id string, gen int64, state dbcloud.OperationState, msg string, now time.Time) error {
	ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: id, Pending: true})
	if err != nil {
		return err
	}
	for _, op := range ops {
		if gen != 0 && op.Generation > gen {
			continue
		}
		op.Finish(state, msg, now)
		if err := tx.UpdateOperation(op); err != nil {
			return err
		}
	}
	return nil
}
