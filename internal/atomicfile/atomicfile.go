// Package atomicfile replaces files so that readers and crashes see either
// the old content or the new, never a torn file. It is the one way dbcloud
// writes a file that something else may read at any moment: TLS keys,
// state files, PostgreSQL's and PgBouncer's configs, snapshot manifests.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Option changes how Write writes.
type Option func(*options)

type options struct {
	uid, gid  int
	chown     bool
	noDirSync bool
}

// Owner makes the file belong to uid and gid, set before any data lands, so
// a process that must own its files (PostgreSQL refuses a key others own)
// never sees a file owned by someone else.
func Owner(uid, gid int) Option {
	return func(o *options) { o.uid, o.gid, o.chown = uid, gid, true }
}

// NoDirSync leaves the fsync of the directory to the caller, who writes
// several files into it and syncs it once with SyncDir: until then the
// rename may not survive a power loss, though readers already see it.
func NoDirSync() Option {
	return func(o *options) { o.noDirSync = true }
}

// Write replaces path with data: a temp file in the same directory (rename
// is only atomic within a filesystem) gets the mode, and the owner if asked,
// before any data, is fsynced and renamed over path, and the directory is
// fsynced so the rename itself survives a power loss.
func Write(path string, data []byte, perm os.FileMode, opts ...Option) (err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	// CreateTemp uses 0600; set the wanted mode before any data lands so a
	// secret is never readable by others, even briefly.
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: chmod: %w", path, err)
	}
	if o.chown {
		if err := f.Chown(o.uid, o.gid); err != nil {
			return fmt.Errorf("write %s: chown: %w", path, err)
		}
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: rename: %w", path, err)
	}
	if o.noDirSync {
		return nil
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// SyncDir fsyncs a directory, so the entries created, renamed or removed
// in it survive a power loss.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
