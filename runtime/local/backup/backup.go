// Package backup keeps a service's backups on this host: its snapshots
// (base backups of the running primary), its WAL archive, and the copies
// (clones where the filesystem can) that snapshots and forks are made of.
// It works on a service directory: snapshots/, archive/, forks/ (the holds
// of forks still restoring) and the "deleted" tombstone.
package backup

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"dbcloud/runtime/local/postgres"
)

// snapshotRetryAfter spaces out attempts after a failed snapshot, each of
// which copies the whole data directory.
const snapshotRetryAfter = 5 * time.Minute

// Backups takes, lists, prunes and copies the backups of the services of
// this host.
type Backups struct {
	instances *postgres.Instances // reach the primary an online backup copies
	binDir    string              // PostgreSQL's binaries (pg_waldump)
	logger    *slog.Logger

	mu      sync.Mutex
	locks   map[string]*serviceLock    // by service dir
	commits map[string]*ArchivedCommit // LastArchivedCommit's answers, by archive state
}

// New returns Backups that reach instances through instances and read WAL
// with the binaries in binDir.
func New(instances *postgres.Instances, binDir string, logger *slog.Logger) *Backups {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Backups{
		instances: instances, binDir: binDir, logger: logger,
		locks: map[string]*serviceLock{}, commits: map[string]*ArchivedCommit{},
	}
}

// SnapshotsDir is where a service's snapshots are.
func SnapshotsDir(serviceDir string) string { return filepath.Join(serviceDir, snapshotsDirName) }

// ArchiveDir is where a service archives its WAL.
func ArchiveDir(serviceDir string) string { return filepath.Join(serviceDir, archiveDirName) }

// Policy is how often snapshots are taken and how long they are kept.
type Policy struct {
	Interval, Retention time.Duration
}

// Maintain does whatever backup work of the service is due: a snapshot
// (of the primary that primary finds running) when it has none or the
// newest is older than the interval, then pruning of expired snapshots and
// of the WAL only they needed. It is cheap when nothing is due (a directory
// listing), returns at once when a snapshot of the service is already being
// taken, and does nothing when no primary runs.
func (b *Backups) Maintain(ctx context.Context, serviceDir string, policy Policy, primary func() (postgres.Spec, bool)) error {
	l := b.lockOf(serviceDir)
	if !l.snapshot.TryLock() {
		return nil
	}
	defer l.snapshot.Unlock()
	// Another control plane on a shared runtime directory may be at it.
	fl, ok, err := tryLockSnapshots(serviceDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the service was deleted meanwhile
	}
	if err != nil || !ok {
		return err
	}
	defer fl.Unlock()
	snaps, err := b.Snapshots(serviceDir)
	if err != nil {
		return err
	}
	now := time.Now()
	changed := false
	if (len(snaps) == 0 || now.Sub(snaps[len(snaps)-1].Finished) >= policy.Interval) &&
		now.Sub(l.failed) >= snapshotRetryAfter {
		src, ok := primary()
		if !ok {
			return nil
		}
		if _, err := b.take(ctx, serviceDir, src); err != nil {
			if ctx.Err() == nil {
				l.failed = now
			}
			return err
		}
		changed = true
		if snaps, err = b.Snapshots(serviceDir); err != nil {
			return err
		}
	}
	if !changed && len(expiredSnapshots(snaps, now.Add(-policy.Retention))) == 0 {
		return nil
	}
	return b.prune(serviceDir, policy.Retention, now)
}
