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

	"dbcloud/internal/atomicfile"
	"dbcloud/runtime/local/backup"
	"dbcloud/runtime/local/postgres"

	"dbcloud"
)

// A fork is built from its parent's files alone (the runtime has no store):
// DATA/services/<parent>/snapshots and archive, and for NOW the parent's
// running primary, found through its postmaster.pid. While it restores, it
// holds its parent's backup files (backup.Backups.Hold), so that deleting
// the parent or pruning keeps what the fork still needs. Once restored, a
// fork shares nothing with its parent: its data directory is a copy (or a
// copy-on-write clone) and it has its own certificate, password, archive and
// snapshots.
const (
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
func (rt *Runtime) ensureForkData(ctx context.Context, svc *dbcloud.Service, spec postgres.Spec) error {
	if svc.Fork == nil {
		return nil
	}
	_, noData := os.Stat(spec.PGData())
	_, restoring := os.Stat(filepath.Join(rt.serviceDir(svc.ID), restoreMarker))
	if errors.Is(noData, fs.ErrNotExist) || restoring == nil {
		return rt.restoreFork(ctx, svc, spec)
	}
	return rt.backups.Release(rt.serviceDir(svc.Fork.ServiceID), svc.ID)
}

// restoreFork builds the fork's data directory from its parent, runs
// PostgreSQL's recovery on it and sets the fork's own password:
//
//   - NOW: an online backup of the parent's running primary, straight into
//     the fork's data directory (one copy, or clones), recovered to its end
//     by the fork's own first start (startSealed), left running.
//   - LAST_SNAPSHOT: the newest snapshot, likewise.
//   - PITR: the newest snapshot finished at or before target_time, then the
//     parent's archived WAL replayed up to target_time by a recovery start
//     that is stopped afterwards (recoverToTarget); EnsureService starts it
//     as any service.
func (rt *Runtime) restoreFork(ctx context.Context, svc *dbcloud.Service, spec postgres.Spec) error {
	began := time.Now()
	steps := newStepTimes()
	src := svc.Fork
	if err := rt.holdParent(svc.ID, src.ServiceID); err != nil {
		return err
	}
	marker := filepath.Join(rt.serviceDir(svc.ID), restoreMarker)
	info, _ := json.Marshal(map[string]any{"parent": src.ServiceID, "strategy": src.Strategy, "started": began.UTC()})
	if err := atomicfile.Write(marker, info, 0o600); err != nil {
		return err
	}
	// Start over from whatever an interrupted attempt left.
	if err := rt.stopInstance(ctx, spec, 30*time.Second); err != nil {
		return fmt.Errorf("fork %s: stop an earlier attempt: %w", svc.ID, err)
	}
	if err := os.RemoveAll(spec.PGData()); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(spec.Dir, restoreWALDir)); err != nil {
		return err
	}
	if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
		return err
	}
	steps.done("clean")
	recovery, from, err := rt.restoreData(ctx, svc, spec)
	if err != nil {
		return err
	}
	copied := time.Since(began)
	steps.done("copy")
	if recovery == nil {
		err = rt.startSealed(ctx, svc, spec, steps)
	} else {
		err = rt.recoverToTarget(ctx, svc, spec, recovery, steps)
	}
	var failed recoveryFailed
	if errors.As(err, &failed) {
		rt.cfg.Logger.Error("fork recovery failed", "service", svc.ID, "parent", src.ServiceID, "strategy", src.Strategy, "error", failed.err)
		return dbcloud.Errorf(dbcloud.KindUnavailable,
			"Recovering the fork from service %s (%s) failed; the operator's logs have the details.", src.ServiceID, from)
	}
	if err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(spec.Dir, restoreWALDir)); err != nil {
		return err
	}
	if err := os.Remove(marker); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(rt.serviceDir(svc.ID)); err != nil {
		return err
	}
	rt.cfg.Logger.Info("fork restored", "service", svc.ID, "parent", src.ServiceID, "strategy", src.Strategy,
		"from", from, "copy_ms", copied.Milliseconds(), "steps", steps.String(), "ms", time.Since(began).Milliseconds())
	return rt.backups.Release(rt.serviceDir(src.ServiceID), svc.ID)
}

// startSealed starts the fork's primary on a data directory that is a
// whole base backup (backup_label and the WAL to its end in pg_wal): with
// no recovery.signal, PostgreSQL runs crash recovery from the backup's
// checkpoint through the end of the copied WAL, past the backup's end
// record, and comes up as a primary on its own. That postmaster is the
// fork's for good, with the fork's own configuration, listening where the
// fork listens, so the fork is ready after one start rather than a
// recovery start, a stop and a start (about 0.3 s saved). Its roles have
// the parent's passwords until setVerifier gives tsdbadmin the fork's:
// until then the sealed pg_hba.conf lets in only dbcloud over the unix
// socket, and the ensure that follows opens it by a reload.
func (rt *Runtime) startSealed(ctx context.Context, svc *dbcloud.Service, spec postgres.Spec, steps *stepTimes) error {
	sealed := spec
	sealed.Sealed = true
	if err := rt.instances.Prepare(ctx, sealed); err != nil {
		return err
	}
	steps.done("prepare")
	return rt.startRestored(ctx, svc, spec, sealed, steps)
}

// startRestored starts the fork's restored data directory as start says
// (sealed, or with recovery settings), checks that it came up promoted,
// gives it the fork's own password and drops the parent's credentials.
func (rt *Runtime) startRestored(ctx context.Context, svc *dbcloud.Service, spec, start postgres.Spec, steps *stepTimes) error {
	if _, err := rt.instances.Start(ctx, start); err != nil {
		return recoveryFailed{err}
	}
	steps.done("recover")
	if err := rt.checkPromoted(ctx, spec); err != nil {
		return err
	}
	if err := rt.setVerifier(ctx, spec, svc.PasswordVerifier); err != nil {
		return err
	}
	steps.done("password")
	if err := rt.dropInheritedCredentials(ctx, spec); err != nil {
		return err
	}
	steps.done("credentials")
	return nil
}

// recoverToTarget runs PostgreSQL's archive recovery on the fork's data
// directory to the point the settings say, promotes it, sets the fork's
// own password and stops it: EnsureService starts it as any service.
// Recovery settings go on the command line of that one postmaster, never
// into a config file, so nothing of them lingers; it listens on its unix
// socket only, so nobody logs in with the parent's password meanwhile.
func (rt *Runtime) recoverToTarget(ctx context.Context, svc *dbcloud.Service, spec postgres.Spec, recovery map[string]string, steps *stepTimes) error {
	if err := rt.instances.WriteServerFile(spec, filepath.Join(spec.PGData(), "recovery.signal"), nil, 0o600); err != nil {
		return err
	}
	if err := rt.instances.Prepare(ctx, spec); err != nil {
		return err
	}
	steps.done("prepare")
	recovery["listen_addresses"] = ""
	// Hot standby would refuse to replay WAL of a parent with more
	// connections or workers than the fork's size allows; nobody needs to
	// connect before the promotion anyway.
	recovery["hot_standby"] = "off"
	recovery["recovery_target_action"] = "promote"
	rs := spec
	rs.RecoverySettings = recovery
	if err := rt.startRestored(ctx, svc, spec, rs, steps); err != nil {
		return err
	}
	if err := rt.stopInstance(ctx, spec, 30*time.Second); err != nil {
		return err
	}
	steps.done("stop")
	return nil
}

// recoveryFailed is a fork's recovery start that failed: the user is told
// it failed, the operator's log has why.
type recoveryFailed struct{ err error }

func (e recoveryFailed) Error() string { return e.err.Error() }

// checkPromoted makes sure the fork's recovery is over: it is a primary.
func (rt *Runtime) checkPromoted(ctx context.Context, spec postgres.Spec) error {
	var inRecovery bool
	conn, err := rt.instances.Connect(ctx, spec, "postgres")
	if err != nil {
		return err
	}
	err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	if inRecovery {
		return fmt.Errorf("fork %s: still in recovery after start", spec.ID)
	}
	return nil
}

// holdParent records that the fork restores from the parent's files. It
// fails, for good, when the parent's files are gone or going.
func (rt *Runtime) holdParent(forkID, parentID string) error {
	err := rt.backups.Hold(rt.serviceDir(parentID), forkID)
	if errors.Is(err, backup.ErrParentGone) {
		return dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindConflict,
			"Service %s, the parent of this fork, was deleted before the fork copied its data; delete this fork.", parentID))
	}
	return err
}

// restoreData puts the fork's data directory in place and returns the
// recovery settings that bring it to the fork's point (nil: the directory
// is a whole base backup, which crash recovery brings to its end), and
// what it was restored from (for logs and messages).
//
// Why a NOW fork is consistent and loses nothing committed before it was
// asked for: the copy is made between pg_backup_start and pg_backup_stop,
// so every page a file copy (or clone) caught half-written or out of date
// is rewritten by replay from the backup's start checkpoint, where
// full-page writes are forced; the backup_label names that checkpoint,
// and pg_wal holds the WAL through pg_backup_stop's end record, which is
// after every commit acknowledged before the request. Recovery refuses to
// finish before that record ("WAL ends before end of online backup"). On
// a filesystem that clones, each file's clone is atomic but the set is
// not, which is exactly the case the backup protocol covers; the parent's
// service volume as one btrfs snapshot would be atomic, but a snapshot is
// a subvolume of its own, outside the fork's quota group, and its files
// cannot be renamed into the fork's volume (EXDEV), so they would be
// cloned one by one all the same.
func (rt *Runtime) restoreData(ctx context.Context, svc *dbcloud.Service, spec postgres.Spec) (map[string]string, string, error) {
	src := svc.Fork
	owner := backup.CopyOptions{Owner: rt.instances.Owner(spec)}
	switch src.Strategy {
	case dbcloud.ForkNow:
		parent, ok := rt.runningPrimary(src.ServiceID)
		if !ok {
			return nil, "", dbcloud.Errorf(dbcloud.KindUnavailable, "Service %s is not running; a NOW fork copies its running data. Start it, or fork it with LAST_SNAPSHOT or PITR.", src.ServiceID)
		}
		s, err := rt.backups.OnlineBackup(ctx, parent, spec.PGData(), "dbcloud fork "+svc.ID, owner)
		if err != nil {
			return nil, "", err
		}
		rt.cfg.Logger.Info("fork copied the parent's running data", "service", svc.ID, "parent", src.ServiceID,
			"mb", s.Bytes>>20, "files", s.Files, "reflink", s.Reflinked, "ms", s.DurationMS)
		return nil, "a fresh snapshot", nil

	case dbcloud.ForkLastSnapshot:
		snaps, err := rt.backups.Snapshots(rt.serviceDir(src.ServiceID))
		if err != nil {
			return nil, "", err
		}
		if len(snaps) == 0 {
			return nil, "", dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindConflict, "Service %s has no snapshot to fork from.", src.ServiceID))
		}
		s := snaps[len(snaps)-1]
		// A snapshot is a base backup taken as a NOW fork's copy is.
		if err := rt.backups.CopySnapshot(ctx, s, spec.PGData(), owner); err != nil {
			return nil, "", err
		}
		return nil, "snapshot " + s.Name, nil

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
//
// restoreWALDir, in the fork's instance directory, holds the copy of the
// parent's archived WAL a point-in-time fork replays.
const restoreWALDir = "restore-wal"

func (rt *Runtime) restorePointInTime(ctx context.Context, svc *dbcloud.Service, spec postgres.Spec, owner backup.CopyOptions) (map[string]string, string, error) {
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
	snaps, err := rt.backups.Snapshots(rt.serviceDir(src.ServiceID))
	if err != nil {
		return nil, "", err
	}
	var base *backup.Snapshot
	for i := range snaps {
		if snaps[i].Archived && !snaps[i].Finished.After(target) {
			base = &snaps[i]
		}
	}
	if base == nil {
		return nil, "", dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindInvalid,
			"Service %s has no snapshot finished before %s to replay from.", src.ServiceID, target.Format(time.RFC3339Nano)))
	}
	if err := rt.backups.CopySnapshot(ctx, *base, spec.PGData(), owner); err != nil {
		return nil, "", err
	}
	replay := archive
	if o := owner.Owner; o != nil {
		// The fork's OS user cannot read the parent's archive: it replays
		// a copy of its own, removed once the fork is restored.
		replay = filepath.Join(spec.Dir, restoreWALDir)
		n, err := backup.CopyArchive(ctx, archive, replay, base.StartWAL, o)
		if err != nil {
			return nil, "", fmt.Errorf("fork %s: copy the parent's archived WAL: %w", svc.ID, err)
		}
		rt.cfg.Logger.Info("fork copied the parent's archived WAL", "service", svc.ID, "files", n)
	}
	settings := map[string]string{"restore_command": postgres.RestoreCommand(replay)}
	from := fmt.Sprintf("snapshot %s and archived WAL to %s", base.Name, target.Format(time.RFC3339Nano))
	if running {
		settings["recovery_target_time"] = target.Format("2006-01-02 15:04:05.999999-07")
		return settings, from, nil
	}
	last, err := rt.backups.LastArchivedCommit(ctx, spec.BinDir, archive, base.StartWAL, base.WALSegmentSize)
	if err != nil {
		return nil, "", err
	}
	stop, err := backup.ParseLSN(base.StopLSN)
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
func (rt *Runtime) archiveMarker(ctx context.Context, parent postgres.Spec, archive string) error {
	conn, err := rt.instances.Connect(ctx, parent, "postgres")
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
	return backup.WaitArchived(ctx, archive, segment, archiveWait)
}

// stepTimes records how long each step of a long operation took, for its
// log line: where the time of a fork goes is what makes it slow or fast.
type stepTimes struct {
	last  time.Time
	steps []string
}

func newStepTimes() *stepTimes { return &stepTimes{last: time.Now()} }

// done ends the step named name.
func (s *stepTimes) done(name string) {
	now := time.Now()
	s.steps = append(s.steps, fmt.Sprintf("%s=%dms", name, now.Sub(s.last).Milliseconds()))
	s.last = now
}

func (s *stepTimes) String() string { return strings.Join(s.steps, " ") }
