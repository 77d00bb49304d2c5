package backup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/flock"
)

// While a fork restores, it holds its parent's backup files with a file
// <parent dir>/forks/<fork>. Deleting the parent then removes its instances
// but keeps its snapshots and archive (marked by a file "deleted") until the
// last hold goes; pruning waits for holds too.
//
// Holds, pruning and removal decide under the service's files lock: a
// mutex within this process and the file .files.lock between the control
// planes that share the runtime directory.
const (
	holdsDirName = "forks"
	tombstone    = "deleted"
	filesLock    = ".files.lock"
)

// lockFiles takes the service's files lock; its error wraps
// fs.ErrNotExist when the service directory is gone.
func (b *Backups) lockFiles(serviceDir string) (unlock func(), err error) {
	l := b.lockOf(serviceDir)
	l.files.Lock()
	fl, err := flock.Wait(context.Background(), filepath.Join(serviceDir, filesLock))
	if err != nil {
		l.files.Unlock()
		return nil, err
	}
	return func() { fl.Unlock(); l.files.Unlock() }, nil
}

// ErrParentGone says a fork's parent was deleted before the fork could
// hold its files: the fork can never be restored.
var ErrParentGone = errors.New("the parent's backups are gone")

// Holds lists the forks restoring from the service's files.
func Holds(serviceDir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(serviceDir, holdsDirName))
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

// Hold records that fork restores from the files of the service in
// parentDir. It fails with ErrParentGone when those files are gone or
// going.
func (b *Backups) Hold(parentDir, fork string) error {
	unlock, err := b.lockFiles(parentDir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("hold %s: %w", parentDir, ErrParentGone)
	} else if err != nil {
		return err
	}
	defer unlock()
	_, gone := os.Stat(parentDir)
	_, deleted := os.Stat(filepath.Join(parentDir, tombstone))
	if gone != nil || deleted == nil {
		return fmt.Errorf("hold %s: %w", parentDir, ErrParentGone)
	}
	if err := os.MkdirAll(filepath.Join(parentDir, holdsDirName), 0o700); err != nil {
		return err
	}
	path := filepath.Join(parentDir, holdsDirName, fork)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	return atomicfile.Write(path, nil, 0o600)
}

// Release drops fork's hold on the files in parentDir, and removes them
// when the parent was deleted and this was the last hold.
func (b *Backups) Release(parentDir, fork string) error {
	unlock, err := b.lockFiles(parentDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	defer unlock()
	if err := os.Remove(filepath.Join(parentDir, holdsDirName, fork)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if _, err := os.Stat(filepath.Join(parentDir, tombstone)); err != nil {
		return nil
	}
	if holds, err := Holds(parentDir); err != nil || len(holds) > 0 {
		return err
	}
	b.logger.Info("removing the backups of a deleted service; its last fork no longer needs them", "dir", parentDir)
	return os.RemoveAll(parentDir)
}

// RemoveService removes a deleted service's directory once its instances
// are destroyed. If forks are restoring from it, its snapshots and archive
// stay (marked deleted) until the last of them is done.
func (b *Backups) RemoveService(serviceDir string) error {
	l := b.lockOf(serviceDir)
	l.snapshot.Lock() // a snapshot in flight fails once the instance is gone
	defer l.snapshot.Unlock()
	if _, err := os.Stat(serviceDir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	// So does one another control plane is taking.
	fl, err := lockSnapshots(context.Background(), serviceDir)
	if err != nil {
		return err
	}
	defer fl.Unlock()
	unlock, err := b.lockFiles(serviceDir)
	if err != nil {
		return err
	}
	defer unlock()
	holds, err := Holds(serviceDir)
	if err != nil {
		return err
	}
	if len(holds) == 0 {
		return os.RemoveAll(serviceDir)
	}
	entries, err := os.ReadDir(serviceDir)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(serviceDir, tombstone), nil, 0o600); err != nil {
		return err
	}
	for _, e := range entries {
		switch e.Name() {
		case archiveDirName, snapshotsDirName, holdsDirName, tombstone, filesLock:
			continue
		}
		if err := os.RemoveAll(filepath.Join(serviceDir, e.Name())); err != nil {
			return err
		}
	}
	b.logger.Info("service deleted; its snapshots and archive stay until its forks have restored",
		"dir", serviceDir, "forks", strings.Join(holds, ","))
	return nil
}
