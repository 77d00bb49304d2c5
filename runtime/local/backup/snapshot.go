package backup

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/flock"
	"dbcloud/runtime/local/postgres"
)

// Snapshots are base backups of a service's primary, kept in
// <service dir>/snapshots/<name>: data/ is a data directory as
// PostgreSQL restores it (backup_label, and in pg_wal the WAL from the
// backup's start to its end, so a snapshot restores on its own), and
// manifest.json, written last, says the snapshot is complete. A snapshot
// is built in .tmp-<name> and renamed into place, so a crash never leaves a
// half snapshot that looks whole. Snapshot files never change once written.
//
// Control planes that share a runtime directory serialise a service's
// snapshot work with a file lock, snapshots/.lock, held while a snapshot is
// taken or pruned and while the service is removed: whoever holds it owns
// every .tmp- entry (any other is a leftover of a holder that died), and
// the kernel frees it when its holder dies. Readers check that a listed
// snapshot is whole (manifest, data directory, backup label, WAL) and skip
// one that is not.
const (
	snapshotsLock     = ".lock"
	snapshotsDirName  = "snapshots"
	snapshotDataDir   = "data"
	snapshotManifest  = "manifest.json"
	snapshotTmpPrefix = ".tmp-"
	// snapshotNameLayout sorts by time.
	snapshotNameLayout = "20060102T150405.000Z"
)

// Snapshot describes one complete snapshot (its manifest.json).
type Snapshot struct {
	Name     string    `json:"name"`
	Label    string    `json:"label"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Timeline uint32    `json:"timeline"`
	StartLSN string    `json:"start_lsn"`
	StopLSN  string    `json:"stop_lsn"`
	// StartWAL and StopWAL are the first and last WAL segments the backup
	// needs; both are in data/pg_wal.
	StartWAL       string `json:"start_wal"`
	StopWAL        string `json:"stop_wal"`
	WALSegmentSize uint64 `json:"wal_segment_size"`
	// Archived says WAL archiving was on when the snapshot was taken, so
	// the archive continues from it and a point-in-time restore can start
	// here. Instances made before archiving existed get it at their next
	// restart.
	Archived  bool  `json:"archived"`
	Files     int64 `json:"files"`
	Bytes     int64 `json:"bytes"`
	Reflinked bool  `json:"reflinked"`
	// DurationMS is how long taking it took.
	DurationMS int64 `json:"duration_ms"`

	dir string // where it is; not stored
}

// DataDir is the snapshot's data directory.
func (s Snapshot) DataDir() string { return filepath.Join(s.dir, snapshotDataDir) }

// serviceLock serialises work on one service's backup files, within this
// process. Entries are never removed: they cost a few bytes per service
// ever seen.
type serviceLock struct {
	// snapshot is held while a snapshot of the service is taken, and by a
	// delete, which waits for it.
	snapshot sync.Mutex
	// failed is when the last snapshot failed (guarded by snapshot): the
	// next try waits snapshotRetryAfter rather than copying again at once.
	failed time.Time
	// files is held briefly to add or drop a fork's hold, to prune, and to
	// decide what a delete removes.
	files sync.Mutex
}

func (b *Backups) lockOf(serviceDir string) *serviceLock {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := b.locks[serviceDir]
	if !ok {
		l = &serviceLock{}
		b.locks[serviceDir] = l
	}
	return l
}

// Snapshots returns the service's complete snapshots, oldest first.
func (b *Backups) Snapshots(serviceDir string) ([]Snapshot, error) {
	dir := SnapshotsDir(serviceDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []Snapshot
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, e.Name(), snapshotManifest))
		if errors.Is(err, fs.ErrNotExist) {
			continue // being removed
		} else if err != nil {
			return nil, err
		}
		var s Snapshot
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", e.Name(), err)
		}
		s.dir = filepath.Join(dir, e.Name())
		if err := s.whole(); err != nil {
			b.logger.Warn("skipping an incomplete snapshot", "dir", serviceDir, "snapshot", e.Name(), "error", err)
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Finished.Before(out[j].Finished) })
	return out, nil
}

// whole reports what a restore from the snapshot would miss: its data
// directory with PG_VERSION and backup_label, and the first and last WAL
// segments of the backup. (A rename publishes a snapshot whole; this
// guards against one that lost files afterwards, so that a fork fails at
// once rather than half-way through a copy.)
func (s Snapshot) whole() error {
	need := []string{"PG_VERSION", "backup_label"}
	for _, seg := range []string{s.StartWAL, s.StopWAL} {
		if seg != "" {
			need = append(need, filepath.Join("pg_wal", seg))
		}
	}
	for _, name := range need {
		if _, err := os.Stat(filepath.Join(s.DataDir(), name)); err != nil {
			return err
		}
	}
	return nil
}

// lockSnapshots takes the service's snapshot file lock, waiting for
// another process holding it; tryLockSnapshots does not wait. Both make
// the snapshots directory if it is missing, but never the service's
// directory: work that finds it gone (a delete that finished meanwhile)
// fails with fs.ErrNotExist instead of leaving an orphan behind.
func lockSnapshots(ctx context.Context, serviceDir string) (*flock.Lock, error) {
	if err := makeSnapshotsDir(serviceDir); err != nil {
		return nil, err
	}
	return flock.Wait(ctx, filepath.Join(SnapshotsDir(serviceDir), snapshotsLock))
}

func tryLockSnapshots(serviceDir string) (*flock.Lock, bool, error) {
	if err := makeSnapshotsDir(serviceDir); err != nil {
		return nil, false, err
	}
	return flock.TryLock(filepath.Join(SnapshotsDir(serviceDir), snapshotsLock))
}

func makeSnapshotsDir(serviceDir string) error {
	if err := os.Mkdir(SnapshotsDir(serviceDir), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// expiredSnapshots returns the snapshots retention no longer needs: those
// older than the newest one finished at or before the boundary. That one
// stays, so every time since the boundary remains restorable, and so does
// the newest snapshot whatever its age.
func expiredSnapshots(snaps []Snapshot, boundary time.Time) []Snapshot {
	keep := 0
	for i, s := range snaps {
		if !s.Finished.After(boundary) {
			keep = i
		}
	}
	return snaps[:keep]
}

// Prune removes the snapshots older than retention needs and the archived
// WAL before the oldest snapshot kept. It does nothing while a fork is
// restoring from the service's files: the fork may need exactly what would
// go.
func (b *Backups) Prune(ctx context.Context, serviceDir string, retention time.Duration, now time.Time) error {
	fl, err := lockSnapshots(ctx, serviceDir)
	if err != nil {
		return err
	}
	defer fl.Unlock()
	return b.prune(serviceDir, retention, now)
}

// prune is Prune for a caller holding the snapshot file lock.
func (b *Backups) prune(serviceDir string, retention time.Duration, now time.Time) error {
	unlock, err := b.lockFiles(serviceDir)
	if err != nil {
		return err
	}
	defer unlock()
	if holds, err := Holds(serviceDir); err != nil || len(holds) > 0 {
		return err
	}
	snaps, err := b.Snapshots(serviceDir)
	if err != nil || len(snaps) == 0 {
		return err
	}
	expired := expiredSnapshots(snaps, now.Add(-retention))
	for _, s := range expired {
		// Unpublish first (the manifest), so a half-removed snapshot is
		// never listed.
		if err := os.Remove(filepath.Join(s.dir, snapshotManifest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.RemoveAll(s.dir); err != nil {
			return err
		}
		b.logger.Info("snapshot expired", "dir", serviceDir, "snapshot", s.Name, "finished", s.Finished)
	}
	oldest := snaps[len(expired)]
	removed, err := pruneArchive(ArchiveDir(serviceDir), oldest.StartWAL)
	if err != nil {
		return fmt.Errorf("prune archive of %s: %w", serviceDir, err)
	}
	if removed > 0 {
		b.logger.Info("archived WAL pruned", "dir", serviceDir, "segments", removed, "kept_from", oldest.StartWAL)
	}
	return nil
}

// Take takes a snapshot of the running primary src into the service's
// snapshots directory, waiting for one another process is taking.
func (b *Backups) Take(ctx context.Context, serviceDir string, src postgres.Spec) (Snapshot, error) {
	fl, err := lockSnapshots(ctx, serviceDir)
	if err != nil {
		return Snapshot{}, err
	}
	defer fl.Unlock()
	return b.take(ctx, serviceDir, src)
}

// take is Take for a caller holding the snapshot file lock.
func (b *Backups) take(ctx context.Context, serviceDir string, src postgres.Spec) (Snapshot, error) {
	dir := SnapshotsDir(serviceDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Snapshot{}, err
	}
	// Leftovers of snapshots a crash or an error cut short: no process
	// writes into one, since every writer holds the lock this caller has.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), snapshotTmpPrefix) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return Snapshot{}, err
			}
		}
	}
	name := time.Now().UTC().Format(snapshotNameLayout)
	// The PID says which process wrote a leftover, for whoever looks.
	tmp := filepath.Join(dir, snapshotTmpPrefix+name+"."+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return Snapshot{}, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	// Snapshot files stay root's and private: only restores read them,
	// and a restore sets the owner of what it copies.
	s, err := b.OnlineBackup(ctx, src, filepath.Join(tmp, snapshotDataDir), "dbcloud snapshot "+name, CopyOptions{Sync: true})
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot of %s: %w", src.ID, err)
	}
	s.Name = name
	raw, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return Snapshot{}, err
	}
	if err := atomicfile.Write(filepath.Join(tmp, snapshotManifest), raw, 0o600); err != nil {
		return Snapshot{}, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return Snapshot{}, err
	}
	ok = true
	if err := atomicfile.SyncDir(dir); err != nil {
		return Snapshot{}, err
	}
	s.dir = filepath.Join(dir, name)
	b.logger.Info("snapshot taken", "instance", src.ID, "snapshot", name, "files", s.Files,
		"mb", s.Bytes>>20, "reflink", s.Reflinked, "archived", s.Archived, "ms", s.DurationMS)
	return s, nil
}

// labelStart reads "START WAL LOCATION: 0/2000028 (file
// 000000010000000000000002)" and "START TIMELINE: 1" from a backup label.
var (
	labelStartWAL = regexp.MustCompile(`(?m)^START WAL LOCATION: ([0-9A-F]+/[0-9A-F]+) \(file ([0-9A-F]{24})\)$`)
	labelTimeline = regexp.MustCompile(`(?m)^START TIMELINE: ([0-9]+)$`)
)

// backupSlotName names a backup's temporary replication slot: lower-case
// letters, digits and underscores, as slot names must be.
func backupSlotName() string { return "dbcloud_backup_" + strings.ToLower(rand.Text()) }

// OnlineBackup copies the data directory of the running primary src to
// dst (which must not exist) as a consistent base backup, without stopping
// or locking anything on src: the recipe of runtime-notes section 2.2.
//
//  1. A temporary physical replication slot that reserves WAL at once, so
//     nothing the backup needs is recycled while it copies.
//  2. pg_backup_start(label, fast => true): an immediate checkpoint (the
//     default spread checkpoint once took 214 s). Writes go on.
//  3. Copy the data directory (cloned where the filesystem can), leaving out
//     what pg_basebackup leaves out.
//  4. pg_backup_stop(wait_for_archive => false), which switches WAL after
//     its end record; write its backup_label (and tablespace_map).
//  5. Copy the WAL from the start segment to the stop segment, and the
//     timeline history files, into dst/pg_wal, so the backup restores
//     without any archive.
//
// The session ends the backup and drops the slot however this returns.
func (b *Backups) OnlineBackup(ctx context.Context, src postgres.Spec, dst, label string, opt CopyOptions) (Snapshot, error) {
	began := time.Now()
	conn, err := b.instances.Connect(ctx, src, "postgres")
	if err != nil {
		return Snapshot{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var segSize uint64
	var archiveMode, archiveLibrary string
	if err := conn.QueryRow(ctx, `SELECT (SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'),
		current_setting('archive_mode'), current_setting('archive_library')`).Scan(&segSize, &archiveMode, &archiveLibrary); err != nil {
		return Snapshot{}, fmt.Errorf("backup of %s: %w", src.ID, err)
	}
	slot := backupSlotName()
	if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true, true)", slot); err != nil {
		return Snapshot{}, fmt.Errorf("backup of %s: temporary slot: %w", src.ID, err)
	}
	started := time.Now().UTC()
	if _, err := conn.Exec(ctx, "SELECT pg_backup_start($1, true)", label); err != nil {
		return Snapshot{}, fmt.Errorf("backup of %s: pg_backup_start: %w", src.ID, err)
	}
	stats, err := copyTree(ctx, src.PGData(), dst, copyOptions{skip: backupSkip, owner: opt.Owner, sync: opt.Sync})
	if err != nil {
		return Snapshot{}, fmt.Errorf("backup of %s: %w", src.ID, err)
	}
	var stopText, labelFile, mapFile string
	if err := conn.QueryRow(ctx, "SELECT lsn::text, labelfile, coalesce(spcmapfile, '') FROM pg_backup_stop(false)").
		Scan(&stopText, &labelFile, &mapFile); err != nil {
		return Snapshot{}, fmt.Errorf("backup of %s: pg_backup_stop: %w", src.ID, err)
	}
	finished := time.Now().UTC()
	if err := writeCopyFile(filepath.Join(dst, "backup_label"), []byte(labelFile), opt); err != nil {
		return Snapshot{}, err
	}
	if mapFile != "" {
		if err := writeCopyFile(filepath.Join(dst, "tablespace_map"), []byte(mapFile), opt); err != nil {
			return Snapshot{}, err
		}
	}
	m := labelStartWAL.FindStringSubmatch(labelFile)
	t := labelTimeline.FindStringSubmatch(labelFile)
	if m == nil || t == nil {
		return Snapshot{}, fmt.Errorf("backup of %s: unexpected backup label %q", src.ID, labelFile)
	}
	tli, _ := strconv.ParseUint(t[1], 10, 32)
	startSeg, err := parseSegmentName(m[2], segSize)
	if err != nil {
		return Snapshot{}, err
	}
	stop, err := ParseLSN(stopText)
	if err != nil {
		return Snapshot{}, err
	}
	// The stop segment holds the byte before the stop LSN (XLByteToPrevSeg,
	// as pg_backup_stop names it); the WAL switch that followed completed it.
	stopSeg := segmentOf(uint32(tli), stop-1, segSize)
	walDst := filepath.Join(dst, "pg_wal")
	for no := startSeg.segNo; no <= stopSeg.segNo; no++ {
		name := walSegment{tli: uint32(tli), segNo: no}.name(segSize)
		if _, _, err := copyFile(filepath.Join(src.PGData(), "pg_wal", name), filepath.Join(walDst, name), 0o600, opt.Owner, opt.Sync, nil); err != nil {
			return Snapshot{}, fmt.Errorf("backup of %s: WAL %s: %w", src.ID, name, err)
		}
		stats.Files++
		stats.Bytes += int64(segSize)
	}
	history, _ := filepath.Glob(filepath.Join(src.PGData(), "pg_wal", "*.history"))
	for _, h := range history {
		if _, _, err := copyFile(h, filepath.Join(walDst, filepath.Base(h)), 0o600, opt.Owner, opt.Sync, nil); err != nil && !errors.Is(err, fs.ErrExist) {
			return Snapshot{}, fmt.Errorf("backup of %s: %w", src.ID, err)
		}
	}
	if opt.Sync {
		for _, d := range []string{walDst, dst} {
			if err := atomicfile.SyncDir(d); err != nil {
				return Snapshot{}, err
			}
		}
	}
	if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
		b.logger.Warn("drop temporary backup slot (it goes with the session anyway)", "instance", src.ID, "error", err)
	}
	return Snapshot{
		Label: label, Started: started, Finished: finished, Timeline: uint32(tli),
		StartLSN: m[1], StopLSN: stopText, StartWAL: m[2], StopWAL: stopSeg.name(segSize), WALSegmentSize: segSize,
		Archived: archiveMode != "off" && archiveLibrary == "basic_archive",
		Files:    stats.Files, Bytes: stats.Bytes, Reflinked: stats.Reflinked,
		DurationMS: time.Since(began).Milliseconds(),
	}, nil
}

// writeCopyFile writes a small file into a copy, owned like the copy.
func writeCopyFile(path string, data []byte, opt CopyOptions) error {
	var opts []atomicfile.Option
	if o := opt.Owner; o != nil {
		opts = append(opts, atomicfile.Owner(int(o.Uid), int(o.Gid)))
	}
	return atomicfile.Write(path, data, 0o600, opts...)
}

// CopySnapshot copies a snapshot's data directory to dst (a fork's).
func (b *Backups) CopySnapshot(ctx context.Context, s Snapshot, dst string, opt CopyOptions) error {
	begin := time.Now()
	stats, err := copyTree(ctx, s.DataDir(), dst, copyOptions{owner: opt.Owner, sync: opt.Sync})
	if err != nil {
		return err
	}
	b.logger.Info("snapshot copied", "snapshot", s.Name, "to", dst, "files", stats.Files, "mb", stats.Bytes>>20,
		"reflink", stats.Reflinked, "ms", time.Since(begin).Milliseconds())
	return nil
}
