package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"dbcloud"
	"dbcloud/runtime/local/backup"
	"dbcloud/runtime/local/postgres"
)

// restoreCheckFile keeps, in the service's directory, the result of its
// last verified restore.
const restoreCheckFile = "restore-check.json"

// VerifyRestore proves that the service's newest snapshot restores: it is
// copied (a clone where the filesystem can) with the archived WAL after it
// into a scratch instance, which recovers to the end of the archive and
// starts; recovery must reach what the archive held when the check began,
// and pg_amcheck must find no corruption in any database. The instance is
// then removed. A failed restore is a check with OK false and the reason,
// not an error: errors are for when the check itself could not run. No
// snapshot yet: nil.
//
// The scratch instance listens on no TCP port, archives nothing (the
// service's archive is only read) and lives outside the service's
// directory, so a check neither reaches tenants nor counts against the
// service's storage.
func (rt *Runtime) VerifyRestore(ctx context.Context, svc *dbcloud.Service) (*dbcloud.RestoreCheck, error) {
	dir := rt.serviceDir(svc.ID)
	snaps, err := rt.backups.Snapshots(dir)
	if err != nil || len(snaps) == 0 {
		return nil, err
	}
	snap := snaps[len(snaps)-1]
	expected, err := rt.expectedRestoreLSN(ctx, svc, snap)
	if err != nil {
		return nil, err
	}
	scratch, err := rt.scratchSpec(svc)
	if err != nil {
		return nil, err
	}
	check := &dbcloud.RestoreCheck{Snapshot: snap.Name, Started: time.Now().UTC(), ExpectedLSN: expected.String()}
	restored, err := rt.restoreScratch(ctx, scratch, snap, svc.ID)
	check.Duration = time.Since(check.Started)
	if err == nil {
		check.RestoredLSN = restored.String()
		if restored < expected {
			err = fmt.Errorf("recovery ended at %s, before %s, the end of the archive when the check began", restored, expected)
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err() // interrupted (shutdown, lost lease): no verdict
	}
	if rmErr := rt.removeScratch(scratch); rmErr != nil {
		return nil, rmErr
	}
	check.OK = err == nil
	if err != nil {
		check.Error = err.Error()
		rt.cfg.Logger.Error("restore verification failed", "service", svc.ID, "snapshot", snap.Name, "error", err)
	} else {
		rt.cfg.Logger.Info("restore verified", "service", svc.ID, "snapshot", snap.Name,
			"restored_lsn", check.RestoredLSN, "ms", check.Duration.Milliseconds())
	}
	if err := writeState(filepath.Join(dir, restoreCheckFile), check); err != nil {
		return nil, err
	}
	return check, nil
}

// restoreRecheck is how old a verified restore may grow before the same
// snapshot is verified again: files rot without anyone writing them.
const restoreRecheck = 24 * time.Hour

// maybeVerifyRestore verifies a restore of the service's newest snapshot
// when it has not been verified yet, or its last check is a day old; never
// twice within the configured interval (a short snapshot interval must not
// make the service restore itself over and over), and never with checks
// off (an interval of 0).
func (rt *Runtime) maybeVerifyRestore(ctx context.Context, svc *dbcloud.Service) error {
	if err := rt.removeLeftoverScratch(svc.ID); err != nil {
		return err
	}
	every := rt.cfg.RestoreCheckInterval
	if every <= 0 {
		return nil
	}
	last, err := rt.LastRestoreCheck(svc)
	if err != nil {
		return err
	}
	if last != nil {
		since := time.Since(last.Started)
		snaps, err := rt.backups.Snapshots(rt.serviceDir(svc.ID))
		if err != nil || len(snaps) == 0 {
			return err
		}
		fresh := snaps[len(snaps)-1].Name != last.Snapshot
		if since < every || (!fresh && since < restoreRecheck) {
			return nil
		}
	}
	_, err = rt.VerifyRestore(ctx, svc)
	return err
}

// restoreNotice is what a running service's status says after its last
// restore check failed: its backups may not restore.
func (rt *Runtime) restoreNotice(svc *dbcloud.Service) string {
	last, err := rt.LastRestoreCheck(svc)
	if err != nil || last == nil || last.OK {
		return ""
	}
	return fmt.Sprintf("The last restore check (snapshot %s, %s) failed: %s. Take care before relying on this service's snapshots; the operator's logs have the details.",
		last.Snapshot, last.Started.Format(time.RFC3339), last.Error)
}

// LastRestoreCheck is the service's last verified restore, nil when none
// ran yet.
func (rt *Runtime) LastRestoreCheck(svc *dbcloud.Service) (*dbcloud.RestoreCheck, error) {
	return readState[dbcloud.RestoreCheck](filepath.Join(rt.serviceDir(svc.ID), restoreCheckFile))
}

// expectedRestoreLSN is how far a restore of snap must get: the last
// transaction in the archive after it, else the snapshot's own end.
func (rt *Runtime) expectedRestoreLSN(ctx context.Context, svc *dbcloud.Service, snap backup.Snapshot) (backup.LSN, error) {
	end, err := backup.ParseLSN(snap.StopLSN)
	if err != nil {
		return 0, fmt.Errorf("snapshot %s: %w", snap.Name, err)
	}
	if !snap.Archived {
		return end, nil
	}
	binDir, err := rt.binDirOf(svc)
	if err != nil {
		return 0, err
	}
	last, err := rt.backups.LastArchivedCommit(ctx, binDir, rt.archiveDir(svc.ID), snap.StopWAL, snap.WALSegmentSize)
	if err != nil {
		return 0, err
	}
	if last != nil && last.LSN > end {
		return last.LSN, nil
	}
	return end, nil
}

// scratchSpec is the service's primary spec moved to a scratch directory
// of its own, with nothing archived.
func (rt *Runtime) scratchSpec(svc *dbcloud.Service) (postgres.Spec, error) {
	s, err := rt.instanceBase(svc)
	if err != nil {
		return postgres.Spec{}, err
	}
	leftover := rt.scratchOf(svc.ID)
	s.ID, s.Dir = leftover.ID, leftover.Dir
	s.ArchiveDir = ""
	if s.CertPEM, s.KeyPEM, err = rt.serverCert(svc); err != nil {
		return postgres.Spec{}, err
	}
	return s, nil
}

// restoreScratch restores snap and the service's archive into the scratch
// instance, starts it, checks it, and returns where recovery ended.
func (rt *Runtime) restoreScratch(ctx context.Context, s postgres.Spec, snap backup.Snapshot, serviceID string) (backup.LSN, error) {
	// Start over from whatever an interrupted check left.
	if err := rt.removeScratch(s); err != nil {
		return 0, err
	}
	// Traversable, not listable, like the services' directory.
	if err := os.MkdirAll(filepath.Dir(s.Dir), 0o711); err != nil {
		return 0, err
	}
	if err := makeTenantDir(s.Dir, s.Owner); err != nil {
		return 0, err
	}
	owner := backup.CopyOptions{Owner: rt.instances.Owner(s)}
	if err := rt.backups.CopySnapshot(ctx, snap, s.PGData(), owner); err != nil {
		return 0, fmt.Errorf("copy snapshot %s: %w", snap.Name, err)
	}
	if err := rt.instances.WriteServerFile(s, filepath.Join(s.PGData(), "recovery.signal"), nil, 0o600); err != nil {
		return 0, err
	}
	if err := rt.instances.Prepare(ctx, s); err != nil {
		return 0, err
	}
	restore := "/bin/false"
	if snap.Archived {
		restore = postgres.RestoreCommand(rt.archiveDir(serviceID))
	}
	s.RecoverySettings = map[string]string{
		"listen_addresses": "",
		"hot_standby":      "off",
		"restore_command":  restore,
	}
	if _, err := rt.instances.Start(ctx, s); err != nil {
		return 0, fmt.Errorf("the restored instance did not start: %w", err)
	}
	conn, err := rt.instances.Connect(ctx, s, "postgres")
	if err != nil {
		return 0, err
	}
	var inRecovery bool
	var replayed *string
	err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text").Scan(&inRecovery, &replayed)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return 0, err
	}
	if inRecovery {
		return 0, errors.New("the restored instance is still in recovery after it started")
	}
	if replayed == nil {
		return 0, errors.New("the restored instance replayed no WAL")
	}
	lsn, err := backup.ParseLSN(*replayed)
	if err != nil {
		return 0, err
	}
	return lsn, rt.amcheck(ctx, s)
}

// amcheck runs pg_amcheck over every database of the instance (heap and
// B-tree checks; the amcheck extension is installed where missing, which
// only the scratch instance sees).
func (rt *Runtime) amcheck(ctx context.Context, s postgres.Spec) error {
	// The scratch instance's own version: instanceBase named it.
	cmd := exec.CommandContext(ctx, filepath.Join(s.BinDir, "pg_amcheck"), "--all", "--install-missing",
		"--host", s.RunDir(), "--port", strconv.Itoa(s.Port), "--username", "postgres", "--no-password")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_amcheck found problems: %s", firstLines(string(out), 5))
	}
	return nil
}

// scratchOf is the identity and directory of the service's scratch
// instance: all that stopping and removing it needs.
func (rt *Runtime) scratchOf(serviceID string) postgres.Spec {
	id := serviceID + "-verify"
	return postgres.Spec{ID: id, Dir: filepath.Join(rt.cfg.DataDir, "scratch", id)}
}

// removeLeftoverScratch removes a scratch instance a crash left running
// (dbcloud killed during a check). Called under the service's lease, so
// no other control plane checks the service meanwhile, and from the backup
// work, which runs the checks, so this one does not either.
func (rt *Runtime) removeLeftoverScratch(serviceID string) error {
	s := rt.scratchOf(serviceID)
	if _, err := os.Stat(s.Dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	rt.cfg.Logger.Warn("removing a restore check's instance left by an interruption", "service", serviceID)
	return rt.removeScratch(s)
}

// removeScratch stops the scratch instance and removes its files.
func (rt *Runtime) removeScratch(s postgres.Spec) error {
	if err := rt.instances.Destroy(context.Background(), s); err != nil {
		return fmt.Errorf("remove scratch instance %s: %w", s.ID, err)
	}
	return nil
}

// firstLines is the first n lines of a command's output on one line: an
// indented line continues the entry above it, as pg_amcheck writes them.
func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	more := len(lines) > n
	if more {
		lines = lines[:n]
	}
	var b strings.Builder
	for i, l := range lines {
		switch {
		case i == 0:
		case strings.HasPrefix(l, " ") || strings.HasPrefix(l, "\t"):
			b.WriteString(" ")
		default:
			b.WriteString("; ")
		}
		b.WriteString(strings.TrimSpace(l))
	}
	if more {
		b.WriteString(" ...")
	}
	return b.String()
}
