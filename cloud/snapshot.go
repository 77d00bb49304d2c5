package cloud

import (
	"context"
	"fmt"
	"time"

	"dbcloud"
)

// checkForkSource refuses a fork the parent's snapshots and archive cannot
// serve: LAST_SNAPSHOT and PITR need a snapshot, and a PITR target must lie
// in the recovery window. Runtimes without backups are taken to cover
// everything since the parent was created.
func (c *Cloud) checkForkSource(ctx context.Context, parent *dbcloud.Service, strategy dbcloud.ForkStrategy, target *time.Time) error {
	if strategy == dbcloud.ForkNow {
		return nil // the fork takes its own snapshot of the running parent
	}
	w, err := c.recoveryWindow(ctx, parent)
	if err != nil {
		return err
	}
	if w.LastSnapshot.IsZero() {
		return dbcloud.Errorf(dbcloud.KindConflict, "Service %s has no snapshot yet; its first is taken shortly after it becomes READY. Retry in a minute, or fork it with NOW.", parent.ID)
	}
	if strategy != dbcloud.ForkPITR {
		return nil
	}
	if w.From.IsZero() {
		return dbcloud.Errorf(dbcloud.KindConflict, "Service %s has no snapshot with archived WAL yet, so no point in time can be restored. Retry once its next snapshot is taken, or fork it with LAST_SNAPSHOT or NOW.", parent.ID)
	}
	if target.Before(w.From) || target.After(w.To) {
		note := ""
		if w.Stopped {
			note = fmt.Sprintf(" Service %s is not running: its window ends at its last archived transaction.", parent.ID)
		}
		return dbcloud.Errorf(dbcloud.KindInvalid, "target_time %s is outside the recovery window %s to %s.%s",
			target.UTC().Format(time.RFC3339Nano), w.From.UTC().Format(time.RFC3339Nano), w.To.UTC().Format(time.RFC3339Nano), note)
	}
	return nil
}

// recoveryWindow is what a fork of the service can restore now.
func (c *Cloud) recoveryWindow(ctx context.Context, svc *dbcloud.Service) (dbcloud.RecoveryWindow, error) {
	if b := dbcloud.CapabilitiesOf(c.Runtime).Backups; b != nil {
		return b.RecoveryWindow(ctx, svc)
	}
	return dbcloud.RecoveryWindow{LastSnapshot: svc.Created, From: svc.Created, To: c.now()}, nil
}

// ForkWindow tells the caller what a fork of the service can restore (the
// console's PITR time picker).
func (c *Cloud) ForkWindow(ctx context.Context, projectID, id string) (dbcloud.RecoveryWindow, error) {
	v, err := c.GetService(ctx, projectID, id)
	if err != nil {
		return dbcloud.RecoveryWindow{}, err
	}
	return c.recoveryWindow(ctx, v.Service)
}
