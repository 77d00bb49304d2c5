package local

import (
	"time"

	"dbcloud"
	"dbcloud/runtime/local/backup"
)

// backupRevisit is the longest a service with snapshots goes without a
// look at its backups: what another plane on the same runtime directory
// changed, or a restore check a new snapshot calls for, is seen within it.
const backupRevisit = time.Minute

// BackupsDue reports whether the service may have backup work due. After
// a maintenance that left the service with snapshots, nothing is due until
// the next snapshot, the next prune or the next restore check could be
// (backupRevisit at most), so the engine's frequent backup loop does not
// take a lease, twice a store write, for each idle service every few
// seconds: at hundreds of services that was half the control plane's idle
// CPU.
func (rt *Runtime) BackupsDue(svc *dbcloud.Service) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return !time.Now().Before(rt.quiet[svc.ID])
}

// noteBackups records, after a maintenance of the service that succeeded,
// until when nothing of its backups can be due.
func (rt *Runtime) noteBackups(id string, snaps []backup.Snapshot) {
	now := time.Now()
	until := time.Time{}
	if len(snaps) > 0 {
		p := rt.backupPolicy()
		until = now.Add(backupRevisit)
		until = earliest(until, snaps[len(snaps)-1].Finished.Add(p.Interval))
		if len(snaps) > 1 {
			// The oldest goes once the next one is past the retention.
			until = earliest(until, snaps[1].Finished.Add(p.Retention))
		}
		if every := rt.cfg.RestoreCheckInterval; every > 0 {
			until = earliest(until, now.Add(every))
		}
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if until.After(now) {
		rt.quiet[id] = until
	} else {
		delete(rt.quiet, id)
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
