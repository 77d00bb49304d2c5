package cloud

import (
	"context"

	"dbcloud"
)

// SetAutoPause turns a service's auto-pause on (idle_seconds within
// dbcloud.MinIdleSeconds..MaxIdleSeconds) or off (0), at once: the
// engine's idle clock reads it at its next round (decisions.md section
// 10). A service with HA replicas or read replica sets is refused: a
// standby would have to pause and wake with it.
func (c *Cloud) SetAutoPause(ctx context.Context, projectID, id string, idleSeconds int) (*ServiceView, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	setting, err := dbcloud.ParseIdleSeconds(idleSeconds)
	if err != nil {
		return nil, err
	}
	return c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if setting != nil {
			if err := autoPauseAllowed(tx, s); err != nil {
				return "", err
			}
		}
		if s.Status == dbcloud.StatusDeleting {
			return "", busy(tx, s)
		}
		s.AutoPause = setting
		return "", nil
	})
}

// autoPauseAllowed refuses auto-pause on a service that has HA replicas or
// read replica sets.
func autoPauseAllowed(tx dbcloud.Tx, s *dbcloud.Service) error {
	if s.Spec.Replicas > 0 {
		return dbcloud.Errorf(dbcloud.KindConflict, "Service %s has %d HA replicas; auto-pause needs none (setHA to 0 first).", s.ID, s.Spec.Replicas)
	}
	sets, err := tx.ListReplicaSets(s.ProjectID, s.ID)
	if err != nil {
		return err
	}
	if len(sets) > 0 {
		return dbcloud.Errorf(dbcloud.KindConflict, "Service %s has %d read replica sets; auto-pause needs none (delete them first).", s.ID, len(sets))
	}
	return nil
}

// noAutoPause refuses what auto-pause excludes (HA replicas, read replica
// sets) on a service that has it on.
func noAutoPause(s *dbcloud.Service, what string) error {
	if s.AutoPause == nil {
		return nil
	}
	return dbcloud.Errorf(dbcloud.KindConflict, "Service %s has auto-pause on (idle_seconds %d); %s needs it off: setAutoPause with idle_seconds 0 first.",
		s.ID, s.AutoPause.IdleSeconds, what)
}

// WakeService resumes an auto-paused service because a client connected
// to one of its endpoints: the runtime asks, holding the client, and the
// engine starts the service (operation wake, by dbcloud). Admission counts
// it as a start: on a full host or over quota the client is told why. A
// service that is not auto-paused (stopped, or already waking) is not
// woken; the error says so.
func (c *Cloud) WakeService(ctx context.Context, projectID, id string) error {
	host, err := c.hostCapacity()
	if err != nil {
		return err
	}
	defer func() {
		if c.Notify != nil {
			c.Notify()
		}
	}()
	return c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if err := tx.LockProject(projectID); err != nil {
			return err
		}
		s, err := findService(tx, projectID, id)
		if err != nil {
			return err
		}
		if s.Spec.Running && s.Status == dbcloud.StatusResuming {
			return nil // another connection asked first
		}
		if !s.AutoPaused() {
			return dbcloud.Errorf(dbcloud.KindConflict, "Service %s is %s and not auto-paused; start it with startService.", s.ID, s.Status)
		}
		if err := dbcloud.Wake.Check(s); err != nil {
			return err
		}
		if err := busy(tx, s); err != nil {
			return err
		}
		if err := c.admitService(tx, host, s, func(n *dbcloud.Service) { n.Spec.Running = true }); err != nil {
			return err
		}
		s.Spec.Running, s.PausedAt = true, nil
		dbcloud.Wake.Apply(s)
		s.Generation++
		if err := c.insertOperation(ctx, tx, projectID, s.ID, dbcloud.OpWake, s.Generation); err != nil {
			return err
		}
		return tx.UpdateService(s)
	})
}
