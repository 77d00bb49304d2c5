package local

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"dbcloud"
	"dbcloud/runtime/local/backup"
	"dbcloud/runtime/local/postgres"
)

// Every service archives its WAL and is snapshotted on a schedule
// (runtime/local/backup); forks restore from those files (fork.go).

// Defaults of the snapshot schedule (decisions.md section 2; the issue's
// defaults): a snapshot at creation and every 24 hours, kept for 7 days.
const (
	DefaultSnapshotInterval  = 24 * time.Hour
	DefaultSnapshotRetention = 7 * 24 * time.Hour
)

var (
	_ dbcloud.Backups          = (*Runtime)(nil)
	_ dbcloud.BackupMaintainer = (*Runtime)(nil)
)

func (rt *Runtime) archiveDir(id string) string { return backup.ArchiveDir(rt.serviceDir(id)) }

func (rt *Runtime) backupPolicy() backup.Policy {
	p := backup.Policy{Interval: rt.cfg.SnapshotInterval, Retention: rt.cfg.SnapshotRetention}
	if p.Interval <= 0 {
		p.Interval = DefaultSnapshotInterval
	}
	if p.Retention <= 0 {
		p.Retention = DefaultSnapshotRetention
	}
	return p
}

// runningPrimary finds the service's running primary from its files alone
// (the runtime has no store): the instance whose postmaster.pid names a
// live postmaster that reports "ready" (a standby reports "standby", a
// server still recovering "starting"). Connect needs only the directory
// and the port, which postmaster.pid records.
func (rt *Runtime) runningPrimary(id string) (postgres.Spec, bool) {
	dir := rt.serviceDir(id)
	nodes, _ := instanceNodes(dir)
	for _, n := range nodes {
		spec := postgres.Spec{ID: id + "-" + strconv.Itoa(n), Dir: filepath.Join(dir, strconv.Itoa(n))}
		if pf, ok := rt.instances.Live(spec); ok && pf.Status == "ready" && pf.Port > 0 {
			spec.Port = pf.Port
			return spec, true
		}
	}
	return postgres.Spec{}, false
}

// MaintainBackups does whatever backup work of the service is due: a
// snapshot when it has none or the newest is older than the interval, then
// pruning of expired snapshots and of the WAL only they needed. It is
// cheap when nothing is due (a directory listing), returns at once when a
// snapshot of the service is already being taken, and does nothing for a
// service that is not running. Call it for READY services, from a loop of
// its own: a snapshot copies the whole data directory. Then, when due, a
// restore of the newest snapshot is verified (verify.go).
func (rt *Runtime) MaintainBackups(ctx context.Context, svc *dbcloud.Service) error {
	err := rt.backups.Maintain(ctx, rt.serviceDir(svc.ID), rt.backupPolicy(), func() (postgres.Spec, bool) {
		return rt.runningPrimary(svc.ID)
	})
	if err != nil {
		return err
	}
	if err := rt.maybeVerifyRestore(ctx, svc); err != nil {
		return err
	}
	snaps, err := rt.backups.Snapshots(rt.serviceDir(svc.ID))
	if err == nil {
		rt.noteBackups(svc.ID, snaps)
	}
	return nil
}

// RecoveryWindow reports what a fork of the service can restore: the
// newest snapshot, and the PITR window from the oldest snapshot after which
// WAL is archived to now, or, when the service is not running, to its last
// archived transaction (a point-in-time recovery can only stop at a
// transaction's end, so nothing later is restorable). It reads the
// snapshots' manifests and, for a stopped service, the last archived WAL
// segments (cached per archive state).
func (rt *Runtime) RecoveryWindow(ctx context.Context, svc *dbcloud.Service) (dbcloud.RecoveryWindow, error) {
	var w dbcloud.RecoveryWindow
	snaps, err := rt.backups.Snapshots(rt.serviceDir(svc.ID))
	if err != nil || len(snaps) == 0 {
		return w, err
	}
	w.LastSnapshot = snaps[len(snaps)-1].Finished
	var pitr []backup.Snapshot
	for _, s := range snaps {
		if s.Archived {
			pitr = append(pitr, s)
		}
	}
	if len(pitr) == 0 {
		return w, nil
	}
	w.From = pitr[0].Finished
	if _, running := rt.runningPrimary(svc.ID); running {
		w.To = time.Now().UTC()
		return w, nil
	}
	w.Stopped = true
	w.To = pitr[len(pitr)-1].Finished
	binDir, err := rt.binDirOf(svc)
	if err != nil {
		return w, err
	}
	c, err := rt.backups.LastArchivedCommit(ctx, binDir, rt.archiveDir(svc.ID), pitr[0].StartWAL, pitr[0].WALSegmentSize)
	if err != nil {
		return w, fmt.Errorf("recovery window of %s: %w", svc.ID, err)
	}
	if c != nil && c.Time.After(w.To) {
		w.To = c.Time
	}
	return w, nil
}
