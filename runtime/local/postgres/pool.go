package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/flock"
	"dbcloud/internal/supervise"
	"dbcloud/runtime/local/internal/osuser"
	"dbcloud/runtime/local/internal/volume"
)

// Pool entries are directories in PoolDir. A cluster is prepared in
// ".tmp-<random>" and renamed to "ready-<random>" only when complete, so a
// crash mid-way leaves a ".tmp-" entry that Open removes, never a broken
// "ready-" one. Each entry holds pgdata (the cluster, taken by renaming it
// to an instance's Dir/pgdata) plus the socket, config and log of its one
// preparation run.
const (
	poolTmpPrefix   = ".tmp-"
	poolReadyPrefix = "ready-"
	// poolGonePrefix marks a ready entry being removed (the pool shrinks):
	// renamed first, so no create takes it meanwhile.
	poolGonePrefix = poolTmpPrefix + "gone-"
	// poolLockFile is held by the one process that prepares and cleans
	// up pool entries.
	poolLockFile = ".lock"
	// poolLockRetry is how often a process that does not keep the pool
	// tries to take it over.
	poolLockRetry = 2 * time.Second
)

const (
	// poolRecheck is how often the refill loop looks at the pool without
	// being woken, to notice entries removed behind its back: taken by
	// the creates of other control planes sharing the directory, which
	// cannot wake it. A directory listing; cheap.
	poolRecheck = 5 * time.Second
	// poolBackoffMin and poolBackoffMax bound the wait after a failed
	// preparation (disk full, broken binaries); failures are logged at
	// most once per wait, so a persistent one logs about once a minute.
	poolBackoffMin = time.Second
	poolBackoffMax = time.Minute
	// prepareStopTimeout bounds the fast shutdown of a preparation run.
	prepareStopTimeout = 30 * time.Second
	// poolRefillDelay postpones a refill after a take: initdb keeps a core
	// busy for half a second, and the instance that took the cluster is
	// starting and logging in its application right then.
	poolRefillDelay = 500 * time.Millisecond
	// poolUrgentDelay is the shorter wait when one prepared cluster or
	// none is left and no create waits yet: about an instance start on a
	// loaded host.
	poolUrgentDelay = 250 * time.Millisecond
	// poolIdle is how long after the last take a pool grown by a burst
	// shrinks back to PoolSize.
	poolIdle = 2 * time.Minute
	// poolClaimWait bounds how long a create waits for a cluster being
	// prepared rather than preparing one inline; poolClaimPoll is how often
	// it looks (preparations of another plane cannot wake it).
	poolClaimWait = 20 * time.Second
	poolClaimPoll = 10 * time.Millisecond
	// poolStartGrace is how long a create that found the pool empty waits
	// for a refill to begin before it prepares a cluster inline: the loop
	// starts at once when woken, unless its last preparation failed.
	poolStartGrace = time.Second
	// prepareMemory is what one preparation is counted to use, initdb's
	// bootstrap backend or the preparation postmaster (shared_buffers 16MB)
	// with its backends, with room to spare: PoolMemoryShare is divided by
	// it.
	prepareMemory = 64 << 20
	// prepareNice is the nice value of a preparation no create waits for.
	prepareNice = 10
)

// Open removes half-made pool entries left by a crash and starts the
// background loop that keeps PoolSize prepared clusters in PoolDir. The loop
// runs until Close, not until ctx ends.
func (m *Instances) Open(ctx context.Context) error {
	for _, v := range m.versions {
		if err := v.Open(ctx); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(m.PoolDir, 0o755); err != nil {
		return fmt.Errorf("open pool %s: %w", m.PoolDir, err)
	}
	if err := m.checkTraversable(Spec{}, m.PoolDir); err != nil {
		return fmt.Errorf("open pool %s: %w", m.PoolDir, err)
	}
	// With a runtime directory shared by several control planes, one of
	// them keeps the pool: the holder of its lock. It alone prepares and
	// cleans up, so the .tmp- entries it removes are no other plane's work
	// in progress. The others take the lock over when it dies.
	lock, owner, err := flock.TryLock(filepath.Join(m.PoolDir, poolLockFile))
	if err != nil {
		return fmt.Errorf("open pool %s: %w", m.PoolDir, err)
	}
	if owner {
		if err := m.cleanPool(); err != nil {
			lock.Unlock()
			return fmt.Errorf("open pool %s: %w", m.PoolDir, err)
		}
	}
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.mu.Lock()
	if m.cancel != nil {
		m.mu.Unlock()
		cancel()
		return errors.New("open pool: already open")
	}
	m.cancel = cancel
	m.mu.Unlock()
	m.loops.Logger = m.Logger
	m.loops.Loop(loopCtx, supervise.Task{Name: "pool refill", Attrs: []any{"pool_dir", m.PoolDir}}, func(ctx context.Context) {
		if !owner {
			if lock = m.awaitPoolLock(ctx); lock == nil {
				return
			}
		}
		// A panic unlocks on the way out: a restart takes the lock anew.
		owner = false
		defer lock.Unlock()
		m.refillLoop(ctx)
	})
	return nil
}

// awaitPoolLock waits until this process holds the pool's lock (another
// plane that kept the pool stopped or died), cleans up what that plane
// left, and returns the lock; nil once ctx ends.
func (m *Instances) awaitPoolLock(ctx context.Context) *flock.Lock {
	for {
		lock, ok, err := flock.TryLock(filepath.Join(m.PoolDir, poolLockFile))
		if err != nil {
			m.Logger.Error("lock the pool", "error", err)
		}
		if ok {
			m.Logger.Info("this plane keeps the pool of prepared clusters now", "pool_dir", m.PoolDir)
			if err := m.cleanPool(); err != nil {
				m.Logger.Error("clean up the pool", "error", err)
			}
			return lock
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(poolLockRetry):
		}
	}
}

// Close stops the refill loop, abandoning (and removing) a cluster being
// prepared. Running instances are left alone: they outlive the control
// plane.
func (m *Instances) Close() error {
	for _, v := range m.versions {
		v.Close()
	}
	m.mu.Lock()
	cancel := m.cancel
	m.cancel = nil
	m.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	m.loops.Wait()
	return nil
}

// cleanPool removes entries that are not usable: preparations cut short
// by a crash, and ready entries whose cluster was taken but which were not
// yet removed when the crash came.
func (m *Instances) cleanPool() error {
	entries, err := os.ReadDir(m.PoolDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if isTemplate(name) {
			continue // below
		}
		stale := strings.HasPrefix(name, poolTmpPrefix)
		if strings.HasPrefix(name, poolReadyPrefix) {
			_, err := os.Stat(filepath.Join(m.entryDir(name), "pgdata", "PG_VERSION"))
			stale = err != nil
		}
		if stale {
			m.Logger.Info("removing unusable pool entry", "entry", name)
			if err := m.removeEntry(context.Background(), name); err != nil {
				return err
			}
		}
	}
	// Templates of inputs that changed since (a crash can come between
	// making the new one and removing the old).
	if key, err := m.templateKey(); err == nil {
		m.removeStaleTemplates(poolTemplatePrefix + key)
		m.removeTemplateCopies(filepath.Join(m.PoolDir, poolTemplatePrefix+key))
	}
	return nil
}

// readyEntries lists the complete pool entries, oldest name first.
func (m *Instances) readyEntries() []string {
	ready, _ := m.poolEntries()
	return ready
}

// PoolReady is how many prepared clusters wait for creates now.
func (m *Instances) PoolReady() int { return len(m.readyEntries()) }

// PoolTarget is how many prepared clusters the pool is refilled to now:
// PoolSize, or more during a burst of creates (up to PoolMaxSize).
func (m *Instances) PoolTarget() int {
	m.poolMu.Lock()
	defer m.poolMu.Unlock()
	return m.targetLocked()
}

func (m *Instances) targetLocked() int { return max(m.PoolSize, m.burstTarget) }

// addToPool prepares one cluster in a .tmp- entry and publishes it, at
// nice (0: normal priority) when no create is about to wait for it. With
// Identities, the entry has an OS identity of its own, made first (so a
// crash leaves the .tmp- entry that names it, and cleanPool removes both),
// and the cluster is made as it: a create that takes it needs neither a
// new OS user nor a chown.
func (m *Instances) addToPool(ctx context.Context, nice int) (err error) {
	begin := time.Now()
	name := randomName()
	entry := filepath.Join(m.PoolDir, poolTmpPrefix+name)
	defer func() {
		if err != nil {
			_ = m.removeEntry(context.WithoutCancel(ctx), poolTmpPrefix+name)
		}
	}()
	work, err := m.makeEntry(ctx, entry)
	if err != nil {
		return err
	}
	// The cluster initdb makes in it is NOCOW on btrfs (see
	// volume.NoCOWDir): its forks and snapshots clone in a few extents.
	if err := volume.NoCOWDir(work); err != nil {
		return err
	}
	var owner *osuser.Identity
	if m.Identities != nil {
		key := PoolIdentityKey(name)
		who, err := m.Identities.Ensure(ctx, key)
		if err != nil {
			return fmt.Errorf("OS user of pool entry %s: %w", name, err)
		}
		owner = &who
		// Named inside the entry too, which a claim renames whole.
		if err := atomicfile.Write(filepath.Join(work, PoolIdentityFile), []byte(key+"\n"), 0o644, atomicfile.NoDirSync()); err != nil {
			return err
		}
	}
	how, err := m.makeCluster(ctx, work, owner, nice, true)
	if err != nil {
		return err
	}
	if err := os.Rename(entry, filepath.Join(m.PoolDir, poolReadyPrefix+name)); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(m.PoolDir); err != nil {
		return err
	}
	m.Logger.Info("pool cluster prepared", "entry", poolReadyPrefix+name, "from", how, "ms", time.Since(begin).Milliseconds())
	return nil
}

// PoolIdentityFile, in a pool entry made with Identities, holds the osuser
// key of its identity.
const PoolIdentityFile = "identity"

// PoolIdentityKey is the osuser key of the OS identity of the pool entry
// named name (its random part): "p-" and the name, which no service ID
// (letters and digits only) can equal.
func PoolIdentityKey(name string) string { return "p-" + name }

// DrainPool stops the refill for good and removes every pool entry, ready
// or half-made, with its OS identity, and the templates: what a teardown
// of the runtime must not leave on the host. It fails when another
// process keeps the pool (a control plane still running on the
// directory).
func (m *Instances) DrainPool(ctx context.Context) error {
	for _, v := range m.versions {
		if err := v.DrainPool(ctx); err != nil {
			return err
		}
	}
	m.Close()
	lock, ok, err := flock.TryLock(filepath.Join(m.PoolDir, poolLockFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no pool was ever opened here
	} else if err != nil {
		return fmt.Errorf("drain pool %s: %w", m.PoolDir, err)
	}
	if !ok {
		return fmt.Errorf("drain pool %s: another control plane keeps it; stop it first", m.PoolDir)
	}
	defer lock.Unlock()
	entries, err := os.ReadDir(m.PoolDir)
	if err != nil {
		return fmt.Errorf("drain pool %s: %w", m.PoolDir, err)
	}
	for _, e := range entries {
		if e.Name() == poolLockFile {
			continue
		}
		if err := m.removeEntry(ctx, e.Name()); err != nil {
			return fmt.Errorf("drain pool %s: %w", m.PoolDir, err)
		}
	}
	return nil
}

// removeEntry removes a pool entry (by its name in PoolDir) and, with
// Identities, its OS identity, once nothing of the entry runs any more.
// The identity goes before the directory that names it: a crash between
// the two leaves the directory, which the next cleanPool removes (with
// the identity, again), never an OS user that nothing names.
func (m *Instances) removeEntry(ctx context.Context, name string) error {
	dir := filepath.Join(m.PoolDir, name)
	key := name
	for _, prefix := range []string{poolGonePrefix, poolTmpPrefix, poolReadyPrefix} {
		key = strings.TrimPrefix(key, prefix)
	}
	// A template is the Instances' own, no identity's, and no volume.
	if strings.HasPrefix(key, poolTemplatePrefix) {
		return removeWorkDir(dir)
	}
	if m.Identities != nil {
		if err := stopWork(m.entryDir(name)); err != nil {
			return err
		}
		if err := m.Identities.Remove(ctx, PoolIdentityKey(key)); err != nil {
			return err
		}
	}
	return m.removeEntryDir(ctx, dir)
}

func randomName() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// claimEntry takes a ready entry out of the pool by renaming it (or its
// pgdata, with pgdataOnly) to dst, and returns its name. When the pool is
// empty but clusters are being prepared (.tmp- entries exist, by this
// plane or the one keeping the pool), it waits for one up to poolClaimWait:
// a preparation under way finishes sooner than one begun now, and does
// not compete with it for the CPU. It reports "" when there is none, or
// when dst is on another filesystem (rename cannot cross), so the caller
// prepares one inline.
func (m *Instances) claimEntry(ctx context.Context, dst string, pgdataOnly bool) (string, error) {
	begin := time.Now()
	deadline := begin.Add(poolClaimWait)
	first, waiting := true, false
	defer func() {
		if waiting {
			m.waiting.Add(-1)
		}
	}()
	for {
		ready, preparing := m.poolEntries()
		if first {
			m.noteTake(len(ready))
			first = false
		}
		if len(ready) == 0 && !waiting {
			// The refill starts at once for a create that waits.
			waiting = true
			m.waiting.Add(1)
			m.kickRefill()
		}
		for _, name := range ready {
			src := filepath.Join(m.PoolDir, name)
			if pgdataOnly {
				src = filepath.Join(src, "pgdata")
			}
			err := os.Rename(src, dst)
			switch {
			case err == nil:
				if err := atomicfile.SyncDir(filepath.Dir(dst)); err != nil {
					return name, err
				}
				m.kickRefill()
				return name, nil
			case errors.Is(err, fs.ErrNotExist):
				continue // taken concurrently
			case errors.Is(err, syscall.EXDEV):
				m.exdevWarn.Do(func() {
					m.Logger.Warn("pool dir is on another filesystem than the instances; preparing clusters inline",
						"pool_dir", m.PoolDir, "instance_dir", filepath.Dir(dst))
				})
				return "", nil
			default:
				return "", fmt.Errorf("take pool entry %s: %w", name, err)
			}
		}
		// Without a pool of its own (PoolSize 0) a plane does not wait;
		// with one, it gives the refill it just woke poolStartGrace to
		// begin.
		idle := preparing == 0 && time.Since(begin) > poolStartGrace
		if idle || m.PoolSize == 0 || time.Now().After(deadline) {
			return "", nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(poolClaimPoll):
		}
	}
}

// poolEntries lists the complete entries, oldest name first, and counts
// those being prepared.
func (m *Instances) poolEntries() (ready []string, preparing int) {
	entries, _ := os.ReadDir(m.PoolDir)
	for _, e := range entries {
		switch {
		case strings.HasPrefix(e.Name(), poolReadyPrefix) && e.IsDir():
			ready = append(ready, e.Name())
		case strings.HasPrefix(e.Name(), poolTmpPrefix) && !strings.HasPrefix(e.Name(), poolGonePrefix):
			preparing++
		}
	}
	sort.Strings(ready)
	return ready, preparing
}

// Claim takes a prepared cluster for a new service: it renames a whole
// ready entry to dst (which must not exist, on the pool's filesystem), so
// dst/pgdata is the cluster, and returns the osuser key of the OS identity
// its files belong to ("" without Identities). With EntryVolumes the
// entry is a volume, dst the new service's directory (its volume, limited
// by the caller after), and dst/PoolVolumeEntry/pgdata the cluster. ok is
// false when there is none to take (see claimEntry); the caller then
// makes the identity and Prepare the cluster as before.
func (m *Instances) Claim(ctx context.Context, dst string) (key string, ok bool, err error) {
	name, err := m.claimEntry(ctx, dst, false)
	if err != nil || name == "" {
		return "", false, err
	}
	if m.Identities != nil {
		key = PoolIdentityKey(strings.TrimPrefix(name, poolReadyPrefix))
	}
	m.noteClaimed(dst, time.Now())
	m.Logger.Info("pool entry claimed", "entry", name, "dir", dst)
	return key, true, nil
}

// takeFromPool moves a prepared cluster to pgdata and returns the name of
// the entry taken, "" for none. The whole entry is taken with one rename,
// as Claim takes it, into a holding directory beside pgdata: renaming only
// its pgdata would let a concurrent Claim take the rest, an entry without
// a cluster.
func (m *Instances) takeFromPool(ctx context.Context, pgdata string) (string, error) {
	// An entry that is a volume comes out of it only with a claim, whole
	// (Claim): its cluster cannot be renamed out of it.
	if m.volumes != nil {
		return "", nil
	}
	hold := filepath.Join(filepath.Dir(pgdata), ".pool-take")
	// What a crash left here was taken already and is nobody's.
	if err := m.dropTaken(ctx, hold); err != nil {
		return "", err
	}
	name, err := m.claimEntry(ctx, hold, false)
	if err != nil || name == "" {
		return "", err
	}
	if err := os.Rename(filepath.Join(hold, "pgdata"), pgdata); err != nil {
		return "", err
	}
	if err := atomicfile.SyncDir(filepath.Dir(pgdata)); err != nil {
		return "", err
	}
	// The entry's identity is removed by Prepare once the cluster is the
	// instance owner's (removeEntry).
	if err := removeWorkDir(hold); err != nil {
		m.Logger.Warn("remove taken pool entry", "entry", name, "error", err)
	}
	return name, nil
}

// dropTaken removes a pool entry a crash left taken into dir and, with
// Identities, the OS identity it names.
func (m *Instances) dropTaken(ctx context.Context, dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, PoolIdentityFile))
	if errors.Is(err, fs.ErrNotExist) || err == nil && m.Identities == nil {
		return removeWorkDir(dir)
	} else if err != nil {
		return err
	}
	// The identity before the directory that names it (see removeEntry).
	if err := stopWork(dir); err != nil {
		return err
	}
	if err := m.Identities.Remove(ctx, strings.TrimSpace(string(raw))); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
