package cloud

import (
	"context"
	"slices"

	"dbcloud"
)

// mutateService is the frame of every change to an existing service: it
// authorises, finds the service, refuses deleted or busy services, lets fn
// decide, and records fn's operation with the new generation.
//
// fn returns the operation to record, or "" when the change needs none (a
// repeat that is already in effect, or a change to a stopped service that
// takes effect at the next start).
func (c *Cloud) mutateService(ctx context.Context, projectID, id string, fn func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error)) (*ServiceView, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	var view *ServiceView
	err := c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		s, err := findService(tx, projectID, id)
		if err != nil {
			if dbcloud.IsNotFound(err) {
				if _, rerr := tx.FindReplicaSet(projectID, id); rerr == nil {
					return dbcloud.Errorf(dbcloud.KindConflict, "%q is a read replica set; use the replicaSets paths of its service to change it.", id)
				}
			}
			return err
		}
		before := *s
		op, err := fn(tx, s)
		if err != nil {
			return err
		}
		if op != "" {
			s.Generation++
			if err := c.insertOperation(ctx, tx, projectID, s.ID, op, s.Generation); err != nil {
				return err
			}
		}
		if op != "" || !sameService(&before, s) {
			if err := tx.UpdateService(s); err != nil {
				return err
			}
		}
		sets, err := tx.ListReplicaSets(projectID, s.ID)
		if err != nil {
			return err
		}
		view = &ServiceView{Service: s, ReplicaSets: sets}
		return nil
	})
	return view, err
}

// sameService reports whether a mutation left the stored fields unchanged.
func sameService(a, b *dbcloud.Service) bool {
	return a.Status == b.Status && a.Generation == b.Generation && a.Name == b.Name &&
		a.PasswordVerifier == b.PasswordVerifier && specEqual(a.Spec, b.Spec) &&
		(a.AutoPause == nil) == (b.AutoPause == nil) && (a.AutoPause == nil || *a.AutoPause == *b.AutoPause) &&
		(a.PausedAt == nil) == (b.PausedAt == nil)
}

func specEqual(a, b dbcloud.ServiceSpec) bool {
	return a.Size == b.Size && slices.Equal(a.Addons, b.Addons) && a.Environment == b.Environment &&
		a.Replicas == b.Replicas && a.SyncReplicas == b.SyncReplicas && a.Pooler == b.Pooler &&
		a.VPCID == b.VPCID && a.Running == b.Running
}

// busy refuses a change while other work on the service is in flight
// (decisions.md section 6).
func busy(tx dbcloud.Tx, s *dbcloud.Service) error {
	if s.Status == dbcloud.StatusDeleting {
		return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress, "Service %s is being deleted.", s.ID)
	}
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: s.ID, Pending: true, Limit: 1})
	if err != nil {
		return err
	}
	if len(pending) > 0 || s.Status.Transitional() {
		return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress,
			"Service %s is %s with an operation in progress; retry when it is done.", s.ID, s.Status)
	}
	return nil
}

// onlyPending reports whether s has pending operations and all are of type t.
func onlyPending(tx dbcloud.Tx, s *dbcloud.Service, t dbcloud.OperationType) (bool, error) {
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: s.ID, Pending: true})
	if err != nil || len(pending) == 0 {
		return false, err
	}
	for _, op := range pending {
		if op.Type != t {
			return false, nil
		}
	}
	return true, nil
}

// correct is busy for a correction: a change that repairs or shrinks
// (resize, stop, setHA down, disablePooler). On a service that is UNSTABLE,
// or whose pending work keeps failing, it supersedes that work instead of
// refusing, so that a user can always get out of a failure (issue 14). It
// reports whether it superseded anything.
func (c *Cloud) correct(tx dbcloud.Tx, s *dbcloud.Service) (bool, error) {
	if s.Status == dbcloud.StatusDeleting {
		return false, busy(tx, s)
	}
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: s.ID, Pending: true})
	if err != nil {
		return false, err
	}
	if len(pending) == 0 && !s.Status.Transitional() {
		return false, nil
	}
	if s.Status == dbcloud.StatusUpgrading {
		// An upgrade that keeps failing is retried from what is on disk,
		// which only the upgrade itself can read: superseded, it could
		// leave data of the new version under a spec of the old.
		return false, busy(tx, s)
	}
	failing := s.Status == dbcloud.StatusUnstable
	for _, op := range pending {
		failing = failing || op.Attempts > 0
	}
	if !failing {
		return false, busy(tx, s)
	}
	return true, c.supersede(tx, pending, "superseded by a newer request")
}

// correction checks a correction against the transition table, unless
// it superseded failing work: then the status is that work's, and the
// correction is what gets the service out of it.
func correction(t dbcloud.Transition, s *dbcloud.Service, superseded bool) error {
	if superseded {
		return nil
	}
	return t.Check(s)
}
