package engine

import (
	"context"
	"time"

	"dbcloud"
)

// backupLoop has the provisioner take and prune the snapshots of READY
// services, one service at a time, in a loop of its own: a snapshot copies
// a whole data directory, which must not delay health checks. The
// provisioner decides what is due and backs off after failures.
func (e *Engine) backupLoop(ctx context.Context, b dbcloud.BackupMaintainer) {
	t := time.NewTicker(e.BackupInterval)
	defer t.Stop()
	round := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if e.changing() && time.Since(round) < backupYieldMax {
			continue
		}
		round = time.Now()
		w, err := e.settled(ctx)
		if err != nil {
			continue // the health loop logs store errors
		}
		due, _ := b.(backupsDue)
		for _, svc := range w.services {
			if svc.Status == dbcloud.StatusReady && svc.KeptCluster != nil {
				e.guard("kept cluster", svc.ID, func() {
					if err := e.removeExpiredCluster(ctx, svc); err != nil {
						e.Logger.Warn("remove an expired old cluster", "service", svc.ID, "error", err)
					}
				})
			}
			if svc.Status == dbcloud.StatusReady && (due == nil || due.BackupsDue(svc)) {
				e.guard("backup round", svc.ID, func() { e.maintainBackups(ctx, b, svc) })
			}
		}
	}
}

// Snapshots and restore checks copy whole data directories: on a host
// without clones, tens of MB each, whose writes slow every fsync on the
// filesystem. A round of them waits until the engine's changes pause for
// backupYield (a create's instance start and first login took 2-3 times
// as long beside a new service's first snapshot), but never longer than
// backupYieldMax since the last round, so a plane that never pauses still
// takes them.
const (
	backupYield    = time.Second
	backupYieldMax = 30 * time.Second
)

// changing reports whether a worker of this process runs, or ended less
// than backupYield ago.
func (e *Engine) changing() bool {
	e.mu.Lock()
	n := len(e.active)
	e.mu.Unlock()
	return n > 0 || time.Since(time.Unix(0, e.lastChange.Load())) < backupYield
}

// backupsDue is a BackupMaintainer that tells cheaply, without the
// lease, whether a service may have backup work due; one that does not is
// asked to maintain every READY service every BackupInterval.
type backupsDue interface {
	BackupsDue(svc *dbcloud.Service) bool
}

// lastRestoreCheck is the service's last verified restore, nil when the
// runtime verifies none or none ran yet.
func (e *Engine) lastRestoreCheck(c dbcloud.RestoreChecker, svc *dbcloud.Service) *dbcloud.RestoreCheck {
	if c == nil {
		return nil
	}
	check, err := c.LastRestoreCheck(svc)
	if err != nil {
		e.Logger.Warn("read restore check", "service", svc.ID, "error", err)
		return nil
	}
	return check
}

// restoreCheckEvent reports a verified restore that just ended.
func (e *Engine) restoreCheckEvent(ctx context.Context, svc *dbcloud.Service, c *dbcloud.RestoreCheck) error {
	ev := &dbcloud.Event{ProjectID: svc.ProjectID, Type: dbcloud.EventRestoreChecked, ResourceKind: "service",
		ResourceID: svc.ID, Status: "ok", Snapshot: &dbcloud.SnapshotInfo{Name: c.Snapshot}}
	if !c.OK {
		ev.Status, ev.Reason = "failed", c.Error
	}
	return e.Store.Update(ctx, func(tx dbcloud.Tx) error { return tx.InsertEvent(ev) })
}

// maintainBackups runs the service's backup work under its lease: with
// several control planes on one store exactly one takes (or prunes) the
// service's snapshots at a time, and never while another reconciles it.
// A service whose lease another plane holds is left to that plane.
func (e *Engine) maintainBackups(ctx context.Context, b dbcloud.BackupMaintainer, svc *dbcloud.Service) {
	lctx, release, ok := e.claimLeased(ctx, svc.ID)
	if !ok {
		return
	}
	defer release()
	// The snapshots listed before and after, under the lease, tell which
	// this maintenance took, to report them as events exactly once.
	caps := dbcloud.CapabilitiesOf(e.Provisioner)
	lister := caps.Snapshots
	var newest time.Time
	if lister != nil {
		snaps, err := lister.Snapshots(lctx, svc)
		if err != nil {
			e.Logger.Warn("list snapshots", "service", svc.ID, "error", err)
			return
		}
		if len(snaps) > 0 {
			newest = snaps[len(snaps)-1].Finished
		}
	}
	checker := caps.RestoreChecks
	checkedBefore := e.lastRestoreCheck(checker, svc)
	err := b.MaintainBackups(lctx, svc)
	if lctx.Err() != nil {
		return
	}
	if c := e.lastRestoreCheck(checker, svc); c != nil && (checkedBefore == nil || !c.Started.Equal(checkedBefore.Started)) {
		if err := e.restoreCheckEvent(lctx, svc, c); err != nil && lctx.Err() == nil {
			e.Logger.Warn("record restore check event", "service", svc.ID, "error", err)
		}
	}
	if err != nil {
		e.Logger.Warn("maintain backups", "service", svc.ID, "error", err)
	}
	if err := e.snapshotEvents(lctx, lister, svc, newest, err); err != nil && lctx.Err() == nil {
		e.Logger.Warn("record snapshot events", "service", svc.ID, "error", err)
	}
}
