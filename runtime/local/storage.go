package local

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"dbcloud"
	"dbcloud/runtime/local/backup"
	"dbcloud/runtime/local/internal/volume"
)

// storageStateFile records, in the service's directory, whether the
// guard's storage read-only is on for the service, so that every config
// rendered for it (an ensure, a failover, a restart of dbcloud) agrees.
const storageStateFile = "storage.json"

type storageState struct {
	ReadOnly bool `json:"read_only"`
}

func (rt *Runtime) storageStatePath(id string) string {
	return filepath.Join(rt.serviceDir(id), storageStateFile)
}

// storageReadOnly reports whether the service is read-only for being
// near its storage limit.
func (rt *Runtime) storageReadOnly(id string) bool {
	st, err := readState[storageState](rt.storageStatePath(id))
	return err == nil && st != nil && st.ReadOnly
}

// storageSettings adds to an instance's settings what the runtime's
// storage changes, for a service that may keep limit bytes. Where files
// clone, the first start after a crash or a copy (a fork, a replica node)
// syncs the data directory with one syncfs rather than an fsync per file:
// a cloned data directory is metadata, and a thousand fsyncs of it cost
// seconds on btrfs where one commit costs milliseconds. Elsewhere a copy's
// data is dirty in the page cache and the per-file walk flushes only it,
// not the other tenants' writes. A service near its storage limit refuses
// writes that add data (the guard). Temporary files and the WAL that
// replication slots hold are bounded by the limit (tempFileLimit,
// slotWALKeep): neither is data the guard's read-only mode refuses.
func (rt *Runtime) storageSettings(serviceID string, limit int64, settings map[string]string) map[string]string {
	if rt.volumes.Filesystem().Reflink {
		settings["recovery_init_sync_method"] = "syncfs"
	}
	if rt.storageReadOnly(serviceID) {
		settings["dbcloud_guard.storage_read_only"] = "on"
	}
	settings["temp_file_limit"] = strconv.FormatInt(tempFileLimit(limit)>>10, 10)      // kB
	settings["max_slot_wal_keep_size"] = strconv.FormatInt(slotWALKeep(limit)>>20, 10) // MB
	if w := maxWALSize(limit); w > 0 {
		settings["max_wal_size"] = strconv.FormatInt(w>>20, 10) // MB
		settings["min_wal_size"] = "32"                         // MB: keep no more than that recycled
	}
	return settings
}

// maxWALSize is max_wal_size for a service that may keep limit bytes, 0
// for PostgreSQL's default of 1 GiB: an eighth of the limit when that is
// less, and at least 64 MiB. Between two checkpoints pg_wal grows to
// max_wal_size, and it counts against the limit: a service of 400 MiB
// would otherwise reach its quota with WAL alone, where a failed WAL
// write stops PostgreSQL.
func maxWALSize(limit int64) int64 {
	if w := max(limit/8, 64<<20); w < 1<<30 {
		return w
	}
	return 0
}

// tempFileLimit is temp_file_limit, what one process may keep in
// temporary files (a sort, a hash or a materialised result that spilled
// to disk), for a service that may keep limit bytes: a tenth of it, at
// least 64 MiB. Temporary files are in the data directory and count
// against the limit, and a read-only service must still sort: without a
// bound a query with work_mem=64kB writes its whole input there (1 GiB
// for a service of 400 MiB was seen). The query that passes it fails
// (SQLSTATE 53400); the tenant's tsdbadmin cannot raise it (superuser
// only).
func tempFileLimit(limit int64) int64 { return max(limit/10, 64<<20) }

// slotWALKeep is max_slot_wal_keep_size, the most WAL a replication slot
// may hold back in pg_wal, for a service that may keep limit bytes: a
// quarter of it, at least 128 MiB. A slot nobody reads (a dead standby,
// or one a tenant made) would otherwise keep WAL without bound; past it
// the slot is invalidated and its WAL removed. dbcloud's own slots cope:
// an HA standby that lagged that far reads the rest from the WAL archive
// (restore_command) and streams again; a snapshot's slot lives for one
// copy, and a copy that lost its WAL fails and is retried.
func slotWALKeep(limit int64) int64 { return max(limit/4, 128<<20) }

// hardLimit is where the filesystem stops a volume: above the read-only
// level, so that the guard, which acts at the next measurement, stops the
// tenant first, and the quota only a writer faster than the measurements.
// The headroom also holds what PostgreSQL has yet to write of what it
// already committed (dirty shared buffers, WAL): the quota's refusal is
// harsh, PostgreSQL cannot write a page out or stops at a WAL write, and
// even reads fail once it must evict a dirty page. So 10% of the limit,
// and at least 512 MiB.
func hardLimit(limit int64) int64 {
	return limit + max(limit/10, 512<<20)
}

// makeServiceVolume makes the service's directory a volume limited to
// what its size may keep (a btrfs subvolume with a quota where the
// filesystem has quotas, else a plain directory); a resize moves the
// limit. Its owner and mode are makeTenantDir's.
func (rt *Runtime) makeServiceVolume(ctx context.Context, svc *dbcloud.Service, dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return err
	}
	return rt.volumes.Create(ctx, dir, 0o700, hardLimit(rt.cfg.StorageLimits.Of(svc.Spec.Size)))
}

// serviceStorage is what the service keeps on disk: data, WAL archive and
// snapshots. On a volume the filesystem accounts it (a block that a
// snapshot shares with the data counted once); elsewhere it is the
// primary's data directory, the archive's files and the snapshots' sizes
// from their manifests, each snapshot a full copy.
func (rt *Runtime) serviceStorage(ctx context.Context, id string, primaryData func() (int64, error)) (int64, error) {
	dir := rt.serviceDir(id)
	// Near the limit every measurement counts: the filesystem commits
	// first, so what was just written is accounted.
	rt.mu.Lock()
	near := rt.storageNear[id]
	rt.mu.Unlock()
	u, err := rt.volumes.Usage(ctx, dir, near)
	if err == nil {
		return u.Referenced, nil
	}
	if !errors.Is(err, volume.ErrNotAccounted) {
		return 0, err
	}
	total, err := primaryData()
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir(backup.ArchiveDir(dir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			total += fi.Size()
		}
	}
	snaps, err := rt.backups.Snapshots(dir)
	if err != nil {
		return 0, err
	}
	for _, s := range snaps {
		total += s.Bytes
	}
	return total, nil
}

// storageNearPercent is the usage, in percent of the limit, from which
// measurements commit the filesystem first.
const storageNearPercent = 75

// enforceStorage compares what the service keeps with its limit: near it
// the service gets a notice, at the read-only level the guard refuses
// writes that add data (a reload of the primary, no restart), and below
// it again writes resume by themselves. obs.Notice says where it stands.
func (rt *Runtime) enforceStorage(svc *dbcloud.Service, used int64, obs *dbcloud.Observation) {
	limit := rt.cfg.StorageLimits.Of(svc.Spec.Size)
	rt.mu.Lock()
	rt.storageNear[svc.ID] = used*100 >= limit*storageNearPercent
	rt.mu.Unlock()
	was := rt.storageReadOnly(svc.ID)
	level := dbcloud.StorageLevelOf(used, limit, was)
	obs.Notice = dbcloud.StorageNotice(level, used, limit)
	now := level == dbcloud.StorageReadOnly
	if now == was {
		return
	}
	log := rt.cfg.Logger.With("service", svc.ID, "used_mb", used>>20, "limit_mb", limit>>20)
	if err := writeState(rt.storageStatePath(svc.ID), storageState{ReadOnly: now}); err != nil {
		log.Error("storage read-only: state not written", "error", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rt.reloadPrimary(ctx, svc); err != nil {
		// The state is written: the next check or ensure renders it.
		log.Error("storage read-only: reload failed", "read_only", now, "error", err)
		return
	}
	if now {
		log.Warn("service read-only: at its storage limit", "percent", used*100/limit)
	} else {
		log.Info("service writable again: below its storage limit", "percent", used*100/limit)
	}
}

// reloadPrimary renders the primary's config again and makes it re-read
// it.
func (rt *Runtime) reloadPrimary(ctx context.Context, svc *dbcloud.Service) error {
	spec, err := rt.preparePrimary(ctx, svc)
	if err != nil {
		return err
	}
	_, err = rt.instances.Reload(ctx, spec)
	return err
}
