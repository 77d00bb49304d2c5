package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"dbcloud"
)

// A fork is built from its parent's files alone (the runtime has no store):
// DATA/services/<parent>/snapshots and archive, and for NOW the parent's
// running primary, found through its postmaster.pid.
//
// While a fork restores, it holds its parent's backup files with a file
// DATA/services/<parent>/forks/<fork>. Deleting the parent then removes its
// instances but keeps its snapshots and archive (marked by a file "deleted")
// until the last hold goes; pruning waits for holds too. Once restored, a
// fork shares nothing with its parent: its data directory is a copy (or a
// copy-on-write clone) and it has its own certificate, password, archive and
// snapshots.
const (
	holdsDirName = "forks"
	tombstone    = "deleted"
	// restoreMarker, in the fork's service directory, says a restore began
	// and has not finished: the data directory, if any, is not yet usable,
	// and the next attempt starts over.
	restoreMarker = "restoring"
	// archiveWait bounds the wait for the archiver to take the segment that
	// holds a point-in-time fork's marker transaction.
	archiveWait = 2 * time.Minute
)

// ensureForkData gives a fork its data: the first time (and after any
// interrupted attempt) it restores from the parent; afterwards it only
// drops a hold on the parent that a crash after the restore left behind.
// EnsureService calls it for every service with svc.Fork set, before it
// prepares and starts the primary.
func (rt *Runtime) ensureForkData(ctx context.Context, svc *dbcloud.Service, spec InstanceSpec) error {
	if svc.Fork == nil {
		return nil
	}
	_, noData := os.Stat(spec.pgdata())
	_, restoring := os.Stat(filepath.Join(rt.serviceDir(svc.ID), restoreMarker))
	if errors.Is(noData, fs.ErrNotExist) || restoring == nil {
		return rt.restoreFork(ctx, svc, spec)
	}
	return rt.releaseParent(svc.ID, svc.Fork.ServiceID)
}

// restoreFork builds the fork's data directory from its parent and runs
// PostgreSQL's recovery on it until it is promoted, then sets the fork's
// own password and stops it: EnsureService starts it as any service.
//
//   - NOW: an online backup of the parent's running primary, straight into
//     the fork's data directory (one copy), restored to its end.
//   - LAST_SNAPSHOT: the newest snapshot, restored to its end.
//   - PITR: the newest snapshot finished at or before target_time, then the
//     parent's archived WAL replayed up to target_time.
//
// Recovery settings go on the command line of that one postmaster, never
// into a config file, so nothing of them lingers; it listens on its unix
// socket only, so nobody logs in with the parent's password meanwhile.
func (rt *Runtime) restoreFork(ctx context.Context, svc *dbcloud.Service, spec InstanceSpec) error {
	began := time.Now()
	src := svc.Fork
	if err := rt.holdParent(svc.ID, src.ServiceID); err != nil {
		return err
	}
	marker := filepath.Join(rt.serviceDir(svc.ID), restoreMarker)
	info, _ := json.Marshal(map[string]any{"parent": src.ServiceID, "strategy": src.Strategy, "started": began.UTC()})
	if err := writeFileSynced(marker, info, 0o600); err != nil {
		return err
	}
	if err := syncDir(rt.serviceDir(svc.ID)); err != nil {
		return err
	}
	// Start over from whatever an interrupted attempt left.
	if err := rt.mgr.Stop(ctx, spec, 30*time.Second); err != nil {
		return fmt.Errorf("fork %s: stop an earlier attempt: %w", svc.ID, err)
	}
	if err := os.RemoveAll(spec.pgdata()); err != nil {
		return err
	}
	if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
		return err
	}
	recovery, from, err := rt.restoreData(ctx, svc, spec)
	if err != nil {
		return err
	}
	copied := time.Since(began)
	if err := rt.mgr.writeFileAtomic(filepath.Join(spec.pgdata(), "recovery.signal"), nil, 0o600); err != nil {
		return err
	}
	if err := rt.mgr.Prepare(ctx, spec); err != nil {
		return fmt.Errorf("fork %s: %w", svc.ID, err)
	}
	recovery["listen_addresses"] = ""
	// Hot standby would refuse to replay WAL of a parent with more
	// connections or workers than the fork's size allows; nobody needs to
	// connect before the promotion anyway.
	recovery["hot_standby"] = "off"
	recovery["recovery_target_action"] = "promote"
	rs := spec
	rs.RecoverySettings = recovery
	if _, err := rt.mgr.Start(ctx, rs); err != nil {
		rt.cfg.Logger.Error("fork recovery failed", "service", svc.ID, "parent", src.ServiceID, "strategy", src.Strategy, "error", err)
		return dbcloud.Errorf(dbcloud.KindUnavailable,
			"Recovering the fork from service %s (%s) failed; the operator's logs have the details.", src.ServiceID, from)
	}
	var inRecovery bool
	conn, err := rt.mgr.Connect(ctx, spec, "postgres")
	if err != nil {
		return err
	}
	err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	if inRecovery {
		return fmt.Errorf("fork %s: still in recovery after start", svc.ID)
	}
	if err := rt.setVerifier(ctx, spec, svc.PasswordVerifier); err != nil {
		return err
	}
	if err := rt.mgr.Stop(ctx, spec, 30*time.Second); err != nil {
		return err
	}
	if err := os.Remove(marker); err != nil {
		return err
	}
	if err := syncDir(rt.serviceDir(svc.ID)); err != nil {
		return err
	}
	rt.cfg.Logger.Info("fork restored", "service", svc.ID, "parent", src.ServiceID, "strategy", src.Strategy,
		"from", from, "copy_ms", copied.Milliseconds(), "ms", time.Since(began).Milliseconds())
	return rt.releaseParent(svc.ID, src.ServiceID)
}

// restoreData puts the fork's data directory in place and returns the
// recovery settings that bring it to the fork's point, and what it was
// restored from (for logs and messages).
func (rt *Runtime) restoreData(ctx context.Context, svc *dbcloud.Service, spec InstanceSpec) (map[string]string, string, error) {
	src := svc.Fork
	owner := copyOptions{owner: rt.mgr.cred}
	immediate := map[string]string{
		// The WAL the backup needs is in its pg_wal; recovery insists on a
		// restore_command all the same.
		"restore_command": "/bin/false",
		"recovery_target": "immediate",
	}
	switch src.Strategy {
	case dbcloud.ForkNow:
		parent, ok := rt.runningPrimary(src.ServiceID)
		if !ok {
			return nil, "", dbcloud.Errorf(dbcloud.KindUnavailable, "Service %s is not running; a NOW fork copies its running data. Start it, or fork it with LAST_SNAPSHOT or PITR.", src.ServiceID)
		}
		s, err := rt.onlineBackup(ctx, parent, spec.pgdata(), "dbcloud fork "+svc.ID, owner)
		if err != nil {
			return nil, "", err
		}
		rt.cfg.Logger.Info("fork copied the parent's running data", "service", svc.ID, "parent", src.ServiceID,
			"mb", s.Bytes>>20, "files", s.Files, "reflink", s.Reflinked, "ms", s.DurationMS)
		return immediate, "a fresh snapshot", nil

	case dbcloud.ForkLastSnapshot:
		snaps, err := rt.listSnapshots(src.ServiceID)
		if err != nil {
			return nil, "", err
		}
		if len(snaps) == 0 {
			return nil, "", dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindConflict, "Service %s has no snapshot to fork from.", src.ServiceID))
		}
		s := snaps[len(snaps)-1]
		if err := rt.copySnapshot(ctx, s, spec.pgdata(), owner); err != nil {
			return nil, "", err
		}
		return immediate, "snapshot " + s.Name, nil

	case dbcloud.ForkPITR:
		return rt.restorePointInTime(ctx, svc, spec, owner)
	}
	return nil, "", dbcloud.Terminal(fmt.Errorf("fork %s: unknown strategy %q", svc.ID, src.Strategy))
}

// restorePointInTime copies the snapshot to start from and chooses where
// recovery stops. Recovery to a time stops before the first transaction
// that ended after it, and fails when the archive has none; so:
//   - parent running: a marker transaction, ended now (after the target),
//     is written and archived first (pg_switch_wal);
//   - parent stopped: its archive is final. If a transaction ended after
//     the target, stop by time; else stop right after the last one
//     (recovery_target_lsn), which is the same state; if none ended after
//     the snapshot, the snapshot is that state.
func (rt *Runtime) restorePointInTime(ctx context.Context, svc *dbcloud.Service, spec InstanceSpec, owner copyOptions) (map[string]string, string, error) {
	src := svc.Fork
	if src.TargetTime == nil {
		return nil, "", dbcloud.Terminal(fmt.Errorf("fork %s: PITR without a target time", svc.ID))
	}
	target := src.TargetTime.UTC()
	archive := rt.archiveDir(src.ServiceID)
	parent, running := rt.runningPrimary(src.ServiceID)
	if running {
		if err := rt.archiveMarker(ctx, parent, archive); err != nil {
			return nil, "", err
		}
	}
	snaps, err := rt.listSnapshots(src.ServiceID)
	if err != nil {
		return nil, "", err
	}
	var base *snapshot
	for i := range snaps {
		if snaps[i].Archived && !snaps[i].Finished.After(target) {
			base = &snaps[i]
		}
	}
	if base == nil {
		return nil, "", dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindInvalid,
			"Service %s has no snapshot finished before %s to replay from.", src.ServiceID, target.Format(time.RFC3339Nano)))
	}
	if err := rt.copySnapshot(ctx, *base, spec.pgdata(), owner); err != nil {
		return nil, "", err
	}
	settings := map[string]string{"restore_command": "cp " + shellQuote(archive) + `/"%f" "%p"`}
	from := fmt.Sprintf("snapshot %s and archived WAL to %s", base.Name, target.Format(time.RFC3339Nano))
	if running {
		settings["recovery_target_time"] = target.Format("2006-01-02 15:04:05.999999-07")
		return settings, from, nil
	}
	last, err := lastArchivedCommit(ctx, rt.cfg.BinDir, archive, base.StartWAL, base.WALSegmentSize)
	if err != nil {
		return nil, "", err
	}
	stop, err := parseLSN(base.StopLSN)
	if err != nil {
		return nil, "", err
	}
	switch {
	case last == nil || last.LSN < stop:
		settings["recovery_target"] = "immediate"
	case target.Before(last.Time):
		settings["recovery_target_time"] = target.Format("2006-01-02 15:04:05.999999-07")
	default:
		settings["recovery_target_lsn"] = last.LSN.String()
	}
	return settings, from, nil
}

// archiveMarker ends a transaction on the running parent, switches WAL and
// waits until that segment is archived: the archive then holds a
// transaction end later than any target accepted so far.
func (rt *Runtime) archiveMarker(ctx context.Context, parent InstanceSpec, archive string) error {
	conn, err := rt.mgr.Connect(ctx, parent, "postgres")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Two statements, two transactions: the switch must follow the commit.
	if _, err := conn.Exec(ctx, "SELECT txid_current()"); err != nil {
		return fmt.Errorf("marker transaction on %s: %w", parent.ID, err)
	}
	var segment string
	if err := conn.QueryRow(ctx, "SELECT pg_walfile_name(pg_switch_wal())").Scan(&segment); err != nil {
		return fmt.Errorf("switch WAL on %s: %w", parent.ID, err)
	}
	return waitArchived(ctx, archive, segment, archiveWait)
}

// copySnapshot copies a snapshot's data directory to a fork's.
func (rt *Runtime) copySnapshot(ctx context.Context, s snapshot, dst string, opt copyOptions) error {
	begin := time.Now()
	stats, err := copyTree(ctx, s.dataDir(), dst, opt)
	if err != nil {
		return err
	}
	rt.cfg.Logger.Info("snapshot copied", "snapshot", s.Name, "to", dst, "files", stats.Files, "mb", stats.Bytes>>20,
		"reflink", stats.Reflinked, "ms", time.Since(begin).Milliseconds())
	return nil
}

// shellQuote quotes a word for sh (restore_command runs through it).
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// holds lists the forks restoring from the service's files.
func (rt *Runtime) holds(id string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(rt.serviceDir(id), holdsDirName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// holdParent records that the fork restores from the parent's files. It
// fails, for good, when the parent's files are gone or going.
func (rt *Runtime) holdParent(forkID, parentID string) error {
	dir := rt.serviceDir(parentID)
	l := lockOf(dir)
	l.files.Lock()
	defer l.files.Unlock()
	_, gone := os.Stat(dir)
	_, deleted := os.Stat(filepath.Join(dir, tombstone))
	if gone != nil || deleted == nil {
		return dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindConflict,
			"Service %s, the parent of this fork, was deleted before the fork copied its data; delete this fork.", parentID))
	}
	if err := os.MkdirAll(filepath.Join(dir, holdsDirName), 0o700); err != nil {
		return err
	}
	path := filepath.Join(dir, holdsDirName, forkID)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := writeFileSynced(path, nil, 0o600); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// releaseParent drops the fork's hold on its parent's files, and removes
// them when the parent was deleted and this was the last hold.
func (rt *Runtime) releaseParent(forkID, parentID string) error {
	dir := rt.serviceDir(parentID)
	l := lockOf(dir)
	l.files.Lock()
	defer l.files.Unlock()
	if err := os.Remove(filepath.Join(dir, holdsDirName, forkID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, tombstone)); err != nil {
		return nil
	}
	if holds, err := rt.holds(parentID); err != nil || len(holds) > 0 {
		return err
	}
	rt.cfg.Logger.Info("removing the backups of a deleted service; its last fork no longer needs them", "service", parentID)
	return os.RemoveAll(dir)
}

// removeServiceFiles removes the service's directory once its instances
// are destroyed. If forks are restoring from it, its snapshots and archive
// stay (marked deleted) until the last of them is done. A fork deleted
// before its restore finished releases its own hold on its parent.
// DeleteService calls it last.
func (rt *Runtime) removeServiceFiles(svc *dbcloud.Service) error {
	if svc.Fork != nil {
		if err := rt.releaseParent(svc.ID, svc.Fork.ServiceID); err != nil {
			return err
		}
	}
	dir := rt.serviceDir(svc.ID)
	l := lockOf(dir)
	l.snapshot.Lock() // a snapshot in flight fails once the instance is gone
	defer l.snapshot.Unlock()
	l.files.Lock()
	defer l.files.Unlock()
	holds, err := rt.holds(svc.ID)
	if err != nil {
		return err
	}
	if len(holds) == 0 {
		return os.RemoveAll(dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if err := writeFileSynced(filepath.Join(dir, tombstone), nil, 0o600); err != nil {
		return err
	}
	for _, e := range entries {
		switch e.Name() {
		case archiveDirName, snapshotsDirName, holdsDirName, tombstone:
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	rt.cfg.Logger.Info("service deleted; its snapshots and archive stay until its forks have restored",
		"service", svc.ID, "forks", strings.Join(holds, ","))
	return nil
}
