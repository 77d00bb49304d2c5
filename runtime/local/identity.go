package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"dbcloud"
	"dbcloud/internal/atomicfile"
	"dbcloud/runtime/local/internal/osuser"
	"dbcloud/runtime/local/postgres"
)

// Each service runs as an OS user and group of its own (osuser), made on
// its first ensure and removed with it: its postmasters, PgBouncer and
// endpoint proxy, and its read replica sets' (a set reads its parent's
// data, so it is the parent's tenant and identity). Its directory
// DATA/services/<id> is root's with the service's group allowed to
// traverse it (0710), so no other service's user can enter it, and
// everything the service's processes write inside is its user's, 0700 and
// 0600. dbcloud itself, root, reaches each superuser by peer identity;
// the service's user maps to no superuser (postgres.RenderConfig).

//
// A new service takes its identity with its cluster from the pool of
// prepared clusters (postgres.Instances.Claim): each entry is made as an
// identity of its own, named for the entry (dbc-p-<entry>), so a create
// runs neither useradd nor a chown of the cluster. Which identity is the
// service's is recorded in DATA/identities/<id> (root's) from the claim
// until the identity is removed with the service; without a record, it is
// dbc-<id>, made on the service's first ensure when the pool had nothing
// (and for services from before the pool made identities).
//
// The claim is one rename of the whole entry to the service's claimed/
// directory, so no two services ever get the same entry. A crash after it
// is finished by the next ensure (or delete): the entry's identity file
// says whose it is (finishClaim).

// identityPath is the record of the service's identity key.
func (rt *Runtime) identityPath(id string) string {
	return filepath.Join(rt.cfg.DataDir, "identities", id)
}

// claimDir is where a pool entry claimed for the service goes, whole,
// until its cluster is moved to the primary's data directory; where an
// entry claimed as the service's volume (claimVolume) has it too.
func (rt *Runtime) claimDir(id string) string {
	return filepath.Join(rt.serviceDir(id), postgres.PoolVolumeEntry)
}

// settled tells the pool a create of svc claimed from that svc serves
// now, so its refill, held off meanwhile, goes on (see
// postgres.Instances.Settled); nothing when svc claimed nothing.
func (rt *Runtime) settled(svc *dbcloud.Service) {
	if binDir, err := rt.binDirOf(svc); err == nil {
		rt.instances.Version(binDir).Settled(rt.serviceDir(svc.ID), rt.claimDir(svc.ID))
	}
}

// ownerKey is the osuser key of the service's identity: the recorded one
// (recorded now, if a claim was cut short before), else the service's ID.
func (rt *Runtime) ownerKey(id string) (string, error) {
	raw, err := os.ReadFile(rt.identityPath(id))
	if err == nil {
		return strings.TrimSpace(string(raw)), nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	raw, err = os.ReadFile(filepath.Join(rt.claimDir(id), postgres.PoolIdentityFile))
	if errors.Is(err, fs.ErrNotExist) {
		return id, nil
	} else if err != nil {
		return "", err
	}
	key := strings.TrimSpace(string(raw))
	return key, rt.recordOwner(id, key)
}

// recordOwner writes the record of the service's identity key, durably.
func (rt *Runtime) recordOwner(id, key string) error {
	if err := os.MkdirAll(filepath.Dir(rt.identityPath(id)), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(rt.identityPath(id), []byte(key+"\n"), 0o600)
}

// lookupOwner returns the identity of the service with id, nil when
// services run as dbcloud's default user (dbcloud is not root) or the
// service has none yet.
func (rt *Runtime) lookupOwner(id string) (*osuser.Identity, error) {
	if rt.users == nil {
		return nil, nil
	}
	key, err := rt.ownerKey(id)
	if err != nil {
		return nil, err
	}
	who, ok, err := rt.users.Lookup(key)
	if err != nil || !ok {
		return nil, err
	}
	return &who, nil
}

// ensureOwner returns the identity of the service, making it if it does
// not exist: a new service (not a fork, whose data comes from its parent)
// claims a prepared cluster and its identity from the pool, else
// dbc-<id> is made.
func (rt *Runtime) ensureOwner(ctx context.Context, svc *dbcloud.Service) (*osuser.Identity, error) {
	if rt.users == nil {
		return nil, nil
	}
	key, err := rt.ownerKey(svc.ID)
	if err != nil {
		return nil, err
	}
	if claim, err := rt.mayClaim(svc, key); err != nil {
		return nil, err
	} else if claim {
		if key, err = rt.claim(ctx, svc); err != nil {
			return nil, err
		}
	}
	who, err := rt.users.Ensure(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("OS user of service %s: %w", svc.ID, err)
	}
	return &who, nil
}

// mayClaim says whether the service, whose identity key is key, is to
// take a prepared cluster from the pool: a new service (not a fork, whose
// data comes from its parent) that has no identity yet.
func (rt *Runtime) mayClaim(svc *dbcloud.Service, key string) (bool, error) {
	if key != svc.ID || svc.Fork != nil {
		return false, nil
	}
	_, exists, err := rt.users.Lookup(key)
	return !exists, err
}

// claimVolume takes, where the pool's entries are volumes
// (postgres.Instances.EntryVolumes), a prepared cluster and its identity
// for a new service as the service's whole volume, before its limit is
// set (makeServiceVolume), and records the identity. A crash after the
// rename leaves the entry at claimDir, whose identity file ownerKey reads.
// Nothing is claimed for a service whose directory exists: its volume was
// made (the pool had nothing for an earlier ensure), or its data is there.
func (rt *Runtime) claimVolume(ctx context.Context, svc *dbcloud.Service) error {
	if rt.users == nil {
		return nil
	}
	binDir, err := rt.binDirOf(svc)
	if err != nil {
		return err
	}
	pool := rt.instances.Version(binDir)
	dir := rt.serviceDir(svc.ID)
	if !pool.EntryVolumes() {
		return nil
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	key, err := rt.ownerKey(svc.ID)
	if err != nil {
		return err
	}
	if claim, err := rt.mayClaim(svc, key); err != nil || !claim {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return err
	}
	key, ok, err := pool.Claim(ctx, dir)
	if err != nil || !ok || key == "" {
		return err
	}
	return rt.recordOwner(svc.ID, key)
}

// claim takes a prepared cluster and its identity from the pool for a new
// service and records the identity; it returns the service's ID (its own
// identity, to be made) when the pool has none, or the service already
// has data (its instance directory exists). The cluster is of the
// service's PostgreSQL version, from that version's pool. Where its
// entries are volumes, claimVolume took one or found none.
func (rt *Runtime) claim(ctx context.Context, svc *dbcloud.Service) (string, error) {
	id := svc.ID
	binDir, err := rt.binDirOf(svc)
	if err != nil {
		return "", err
	}
	pool := rt.instances.Version(binDir)
	if pool.EntryVolumes() {
		return id, nil
	}
	// An entry claimed already but naming no identity (made before pool
	// entries had one) is used as it is: finishClaim moves its cluster and
	// Prepare gives it to dbc-<id>.
	for _, dir := range []string{filepath.Join(rt.serviceDir(id), "0"), rt.claimDir(id)} {
		if _, err := os.Stat(dir); err == nil {
			return id, nil
		}
	}
	key, ok, err := pool.Claim(ctx, rt.claimDir(id))
	if err != nil || !ok || key == "" {
		return id, err
	}
	return key, rt.recordOwner(id, key)
}

// finishClaim moves the cluster of a claimed pool entry to the primary's
// data directory, unless it has one, and removes what else the entry
// held (its preparation's config and log).
func (rt *Runtime) finishClaim(id string) error {
	dir := rt.claimDir(id)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	inst := filepath.Join(rt.serviceDir(id), "0")
	pgdata := filepath.Join(inst, "pgdata")
	if _, err := os.Lstat(pgdata); errors.Is(err, fs.ErrNotExist) {
		// The instance's directory is made as Prepare makes it; Prepare
		// sets its mode and group again.
		if err := os.MkdirAll(inst, 0o700); err != nil {
			return err
		}
		err := os.Rename(filepath.Join(dir, "pgdata"), pgdata)
		if errors.Is(err, fs.ErrNotExist) {
			// An entry whose cluster was gone when it was claimed (taken
			// by an older dbcloud that moved clusters out of entries
			// without the entry): Prepare makes one for the identity.
			rt.cfg.Logger.Warn("claimed pool entry has no cluster; one is made", "service", id)
			return os.RemoveAll(dir)
		}
		if err != nil {
			return fmt.Errorf("move the claimed cluster of %s: %w", id, err)
		}
		if err := atomicfile.SyncDir(inst); err != nil {
			return err
		}
	}
	return os.RemoveAll(dir)
}

// makeServiceDir makes DATA/services/<id> root's and enterable only by
// owner's group (by everyone without identities: the default user must
// pass).
func (rt *Runtime) makeServiceDir(id string, owner *osuser.Identity) error {
	return makeTenantDir(rt.serviceDir(id), owner)
}

// makeTenantDir makes dir as makeServiceDir makes a service's directory.
func makeTenantDir(dir string, owner *osuser.Identity) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if owner == nil {
		return os.Chmod(dir, 0o711)
	}
	if err := os.Lchown(dir, 0, int(owner.GID)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o710)
}

// removeOwner removes the service's identity once its processes are gone.
// What is left of its directory (kept for forks that still copy from it)
// is made root's alone first: a later service may get the same uid or gid.
func (rt *Runtime) removeOwner(ctx context.Context, id string) error {
	if rt.users == nil {
		return nil
	}
	key, err := rt.ownerKey(id)
	if err != nil {
		return err
	}
	// A claim cut short leaves its cluster here, the identity's.
	if err := os.RemoveAll(rt.claimDir(id)); err != nil {
		return err
	}
	dir := rt.serviceDir(id)
	if err := os.Lchown(dir, 0, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := rt.users.Remove(ctx, key); err != nil {
		return err
	}
	if err := os.Remove(rt.identityPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// proxyBinary returns a copy of the dbcloud binary that every service's
// OS user can run, for endpoint proxies: the binary dbcloud runs from may
// sit in a directory only root can enter (a build's temporary directory).
// It is a hard link when DATA shares the binary's filesystem, else a copy,
// replaced atomically on every start so proxies started from now on run
// this version.
func proxyBinary(dataDir, exe string) (string, error) {
	dir := filepath.Join(dataDir, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "dbcloud-proxy")
	tmp := dst + ".tmp"
	_ = os.Remove(tmp)
	// A link only of a binary everyone may run already: chmod of a link
	// would change the original's mode too.
	linked := false
	if fi, err := os.Stat(exe); err == nil && fi.Mode().Perm()&0o005 == 0o005 {
		linked = os.Link(exe, tmp) == nil
	}
	if !linked {
		if err := copyFile(exe, tmp); err != nil {
			return "", fmt.Errorf("copy %s for the endpoint proxies: %w", exe, err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", err
	}
	return dst, atomicfile.SyncDir(dir)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
