package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"dbcloud"
)

// serviceKind is how the engine's shared flow (resource.go) reads and shows a
// service.
var serviceKind = &kind[dbcloud.Service]{
	name: "service", attr: "service",
	ref: func(s *dbcloud.Service) (string, string, int64) { return s.ProjectID, s.ID, s.Generation },
	status: func(s *dbcloud.Service) (string, string) {
		return string(s.Status), s.StatusReason
	},
	setStatus: func(s *dbcloud.Service, status, reason string) {
		s.Status, s.StatusReason = dbcloud.ServiceStatus(status), reason
	},
	// A lost primary and a delete move a service as the transition
	// table says (transition.go).
	ready: string(dbcloud.PrimaryLost.To), broken: string(dbcloud.PrimaryLost.Through), deleting: string(dbcloud.Delete.Through),
	find: dbcloud.Tx.FindService,
	save: dbcloud.Tx.UpdateService,
	// A deleted service's credentials go with it: their roles went
	// with its data.
	remove: func(tx dbcloud.Tx, projectID, id string) error {
		if err := deleteCredentialsTx(tx, projectID, id); err != nil {
			return err
		}
		return tx.DeleteService(projectID, id)
	},
}

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
	var vpcEndpoint *dbcloud.VPCEndpoint
	ensure := func() (*dbcloud.Observation, error) {
		if err := e.ensureAttachment(ctx, svc); err != nil {
			return nil, err
		}
		vpcEndpoint = svc.VPCEndpoint
		obs, err := e.Provisioner.EnsureService(ctx, svc)
		if err == nil && obs.Running {
			// Before the service shows READY: a fork's inherited roles
			// and roles revoked while it was stopped must not log in.
			err = e.ensureCredentials(ctx, svc)
		}
		return obs, err
	}
	if svc.UpgradeTo != 0 {
		if done, err := e.upgrade(ctx, svc, ensure); done || err != nil {
			return err
		}
	}
	if woken, err := e.waking(ctx, svc); err != nil {
		return err
	} else if woken {
		// A wake that fails is undone, not retried (wakeFailed).
		obs, err := ensure()
		if err != nil {
			return e.wakeFailed(ctx, svc, err)
		}
		ensure = func() (*dbcloud.Observation, error) { return obs, nil }
	}
	return settle(ctx, e, serviceKind, svc, ensure, func(s *dbcloud.Service, obs *dbcloud.Observation, gen int64) {
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
			settleStatus(s, obs)
		}
	})
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
	return findOrNil(ctx, e, func(tx dbcloud.Tx) (*dbcloud.VPC, error) { return tx.FindVPC(projectID, id) })
}

// findOrNil reads one row in its own transaction; nil when it is gone.
func findOrNil[T any](ctx context.Context, e *Engine, find func(tx dbcloud.Tx) (*T, error)) (*T, error) {
	var out *T
	err := e.Store.View(ctx, func(tx dbcloud.Tx) error {
		v, err := find(tx)
		if dbcloud.IsNotFound(err) {
			return nil
		}
		out = v
		return err
	})
	return out, err
}

// settleStatus sets the status of a service whose spec is fully real.
func settleStatus(s *dbcloud.Service, obs *dbcloud.Observation) {
	s.Notice = ""
	switch {
	case !s.Spec.Running:
		s.Status, s.StatusReason = dbcloud.StatusPaused, ""
	case obs.Running:
		s.Status, s.StatusReason, s.Notice = dbcloud.StatusReady, obs.Notice, obs.Notice
	default:
		s.Status, s.StatusReason = dbcloud.StatusUnstable, obs.Reason
	}
}

// showNotice puts the runtime's latest notice for a running service
// (near its storage limit, a failed restore check) in its status reason.
// A notice comes and goes with the measurements, but a reason a change
// left (why an upgrade failed) stays until the next change or a notice.
func showNotice(s *dbcloud.Service, notice string) {
	if notice != "" || s.StatusReason == s.Notice {
		s.StatusReason = notice
	}
	s.Notice = notice
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

// deleteService removes the service's processes, files and VPC address,
// then its rows, then its metrics history.
func (e *Engine) deleteService(ctx context.Context, svc *dbcloud.Service) error {
	err := remove(ctx, e, serviceKind, svc, func() error {
		svc.Spec.VPCID = ""
		if err := e.ensureAttachment(ctx, svc); err != nil {
			return err
		}
		return e.Provisioner.DeleteService(ctx, svc)
	})
	if err != nil {
		return err
	}
	e.mu.Lock()
	delete(e.measured, svc.ID)
	e.mu.Unlock()
	// After a crash here the rows age out with the retention instead.
	if e.History != nil {
		if herr := e.History.Forget(ctx, svc.ID); herr != nil && ctx.Err() == nil {
			e.Logger.Warn("delete metrics history", "service", svc.ID, "error", herr)
		}
	}
	return nil
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

// updateService is update (resource.go) for a service.
func (e *Engine) updateService(ctx context.Context, svc *dbcloud.Service, fn func(s *dbcloud.Service) bool, then func(tx dbcloud.Tx) error) error {
	return update(ctx, e, serviceKind, svc, fn, then)
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
