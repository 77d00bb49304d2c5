package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"dbcloud/internal/atomicfile"
	"dbcloud/runtime/local/internal/osuser"
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

// lookupOwner returns the identity of the service with id, nil when
// services run as dbcloud's default user (dbcloud is not root) or the
// service has none yet.
func (rt *Runtime) lookupOwner(id string) (*osuser.Identity, error) {
	if rt.users == nil {
		return nil, nil
	}
	who, ok, err := rt.users.Lookup(id)
	if err != nil || !ok {
		return nil, err
	}
	return &who, nil
}

// ensureOwner returns the identity of the service with id, making it if it
// does not exist.
func (rt *Runtime) ensureOwner(ctx context.Context, id string) (*osuser.Identity, error) {
	if rt.users == nil {
		return nil, nil
	}
	who, err := rt.users.Ensure(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("OS user of service %s: %w", id, err)
	}
	return &who, nil
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
	dir := rt.serviceDir(id)
	if err := os.Lchown(dir, 0, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return rt.users.Remove(ctx, id)
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
