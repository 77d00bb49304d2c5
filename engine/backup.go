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
	defer e.wg.Done()
	t := time.NewTicker(e.BackupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w, err := e.settled(ctx)
		if err != nil {
			continue // the health loop logs store errors
		}
		for _, svc := range w.services {
			if svc.Status == dbcloud.StatusReady {
				e.maintainBackups(ctx, b, svc)
			}
		}
	}
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
	lister, _ := b.(dbcloud.SnapshotLister)
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
	err := b.MaintainBackups(lctx, svc)
	if lctx.Err() != nil {
		return
	}
	if err != nil {
		e.Logger.Warn("maintain backups", "service", svc.ID, "error", err)
	}
	if err := e.snapshotEvents(lctx, lister, svc, newest, err); err != nil && lctx.Err() == nil {
		e.Logger.Warn("record snapshot events", "service", svc.ID, "error", err)
	}
}
