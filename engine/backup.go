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
	lister, _ := b.(dbcloud.SnapshotLister)
	// seen is the newest snapshot reported per service. A service first
	// met is listed before its maintenance, so the snapshot that the
	// maintenance takes is reported.
	seen := map[string]time.Time{}
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
		forgetGone(seen, w.services)
		for _, svc := range w.services {
			e.mu.Lock()
			busy := e.active[svc.ID]
			e.mu.Unlock()
			if busy || svc.Status != dbcloud.StatusReady {
				continue
			}
			if _, ok := seen[svc.ID]; !ok && lister != nil {
				snaps, err := lister.Snapshots(ctx, svc)
				if err != nil {
					continue
				}
				seen[svc.ID] = time.Time{}
				if len(snaps) > 0 {
					seen[svc.ID] = snaps[len(snaps)-1].Finished
				}
			}
			err := b.MaintainBackups(ctx, svc)
			if err != nil && ctx.Err() == nil {
				e.Logger.Warn("maintain backups", "service", svc.ID, "error", err)
			}
			if ctx.Err() != nil {
				return
			}
			newest, eerr := e.snapshotEvents(ctx, lister, svc, seen[svc.ID], err)
			if eerr != nil {
				e.Logger.Warn("record snapshot events", "service", svc.ID, "error", eerr)
				continue
			}
			seen[svc.ID] = newest
		}
	}
}

// forgetGone drops what backupLoop remembers of services no longer there.
func forgetGone(seen map[string]time.Time, services []*dbcloud.Service) {
	here := make(map[string]bool, len(services))
	for _, s := range services {
		here[s.ID] = true
	}
	for id := range seen {
		if !here[id] {
			delete(seen, id)
		}
	}
}
