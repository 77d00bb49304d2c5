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
			e.mu.Lock()
			busy := e.active[svc.ID]
			e.mu.Unlock()
			if busy || svc.Status != dbcloud.StatusReady {
				continue
			}
			if err := b.MaintainBackups(ctx, svc); err != nil && ctx.Err() == nil {
				e.Logger.Warn("maintain backups", "service", svc.ID, "error", err)
			}
		}
	}
}
