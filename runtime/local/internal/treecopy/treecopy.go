// Package treecopy copies a directory tree (a data directory, a snapshot, a
// template cluster) with its modes, cloning files where the filesystem can.
package treecopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"dbcloud/internal/atomicfile"
	"dbcloud/runtime/local/internal/volume"
)

// copyWorkers is how many files are copied at once. Copies are bound by the
// disk and by per-file metadata work (on this kind of host each file create
// costs about a millisecond of system time), and a few files in flight hide
// that latency; more would only contend on two cores.
const copyWorkers = 4

// Options says how Tree copies.
type Options struct {
	// Skip, when set, leaves out an entry (rel is slash-separated, relative
	// to the source root); for a directory, skipContents keeps the
	// directory but none of its contents.
	Skip func(rel string, d fs.DirEntry) (skip, skipContents bool)
	// Owner, when set, owns every copied entry (PostgreSQL refuses a data
	// directory it does not own).
	Owner *syscall.Credential
	// Sync makes the copy durable before Tree returns: every file and
	// directory fsynced, or, when files were cloned, one syncfs of the
	// destination's filesystem (a clone writes only metadata, and fsyncing
	// a thousand clones one by one costs seconds on btrfs where one commit
	// costs milliseconds). A data directory that PostgreSQL starts from
	// needs none: a server that finds no clean shutdown in pg_control
	// syncs its whole data directory before recovery.
	Sync bool
	// Nice, when above 0, is the nice value the copying threads run at:
	// background work (the pool's preparations) yields the CPU to what
	// requests wait for. Where dbcloud's threads share a cgroup level with
	// the instances' groups (cgroup v1 with dbcloud in the root group) it
	// weighs against them too.
	Nice int
}

// Stats says what Tree did.
type Stats struct {
	Files, Bytes int64
	// Reflinked says the files were cloned (FICLONE), sharing blocks with
	// the source until either side writes, rather than copied.
	Reflinked bool
}

// Tree copies the tree at src to dst, which must not exist, keeping
// modes. Regular files are cloned with FICLONE where the filesystem can
// (XFS with reflink, btrfs): a clone is copy-on-write, so the copy shares no
// mutable state with the source, and costs only metadata. Elsewhere the
// kernel copies them (copy_file_range, with no trip through user space).
// Files that vanish during the walk (a live data directory drops and
// recycles files) are skipped, as pg_basebackup does; what they held is
// rebuilt from WAL.
func Tree(ctx context.Context, src, dst string, opt Options) (Stats, error) {
	var (
		stats    Stats
		files    atomic.Int64
		bytes    atomic.Int64
		clones   atomic.Int64
		noClone  atomic.Bool
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
		dirs     []string
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	type job struct {
		src, dst string
		mode     fs.FileMode
	}
	jobs := make(chan job, 64)
	for range copyWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if opt.Nice > 0 {
				defer lowerThread(opt.Nice)()
			}
			for j := range jobs {
				if ctx.Err() != nil {
					continue
				}
				n, cloned, err := File(j.src, j.dst, j.mode, opt.Owner, opt.Sync, &noClone)
				if errors.Is(err, fs.ErrNotExist) {
					continue // dropped while we walked
				}
				if err != nil {
					fail(err)
					continue
				}
				files.Add(1)
				bytes.Add(n)
				if cloned {
					clones.Add(1)
				}
			}
		}()
	}
	walkErr := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != src {
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		skipContents := false
		if rel != "." && opt.Skip != nil {
			var skip bool
			skip, skipContents = opt.Skip(filepath.ToSlash(rel), d)
			if skip {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
			// Mkdir applies the umask; the data directory must be 0700 or
			// 0750 exactly, so set the mode as it was.
			if err := os.Chmod(target, info.Mode().Perm()); err != nil {
				return err
			}
			if err := Chown(target, opt.Owner); err != nil {
				return err
			}
			// Files made in it later (by the copy, or by the PostgreSQL
			// that runs on it) take its flag, as they did in the source.
			if err := matchDirNoCOW(target, path); err != nil {
				return err
			}
			dirs = append(dirs, target)
			if skipContents {
				return filepath.SkipDir
			}
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
			if err := Chown(target, opt.Owner); err != nil {
				return err
			}
		case d.Type().IsRegular():
			select {
			case jobs <- job{src: path, dst: target, mode: info.Mode().Perm()}:
			case <-ctx.Done():
				return ctx.Err()
			}
		default:
			// Sockets and the like are not data.
		}
		return nil
	})
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return stats, fmt.Errorf("copy %s to %s: %w", src, dst, firstErr)
	}
	if walkErr != nil {
		return stats, fmt.Errorf("copy %s to %s: %w", src, dst, walkErr)
	}
	switch {
	case opt.Sync && clones.Load() > 0:
		if err := syncFS(dst); err != nil {
			return stats, fmt.Errorf("copy %s to %s: %w", src, dst, err)
		}
	case opt.Sync:
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := atomicfile.SyncDir(dirs[i]); err != nil {
				return stats, err
			}
		}
	}
	stats.Files, stats.Bytes = files.Load(), bytes.Load()
	stats.Reflinked = stats.Files > 0 && clones.Load() == stats.Files
	return stats, nil
}

// File copies one regular file to a new file dst, by FICLONE unless
// noClone says the filesystem cannot (it is set at the first refusal).
func File(src, dst string, mode fs.FileMode, owner *syscall.Credential, sync bool, noClone *atomic.Bool) (n int64, cloned bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return 0, false, err
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	if owner != nil {
		if err := out.Chown(int(owner.Uid), int(owner.Gid)); err != nil {
			return 0, false, err
		}
	}
	if noClone == nil || !noClone.Load() {
		// A NOCOW file clones only into a NOCOW file, and a
		// copy-on-write one only into a copy-on-write one.
		if err := volume.MatchNoCOW(out, in); err != nil {
			return 0, false, err
		}
		cerr := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
		if cerr == nil {
			// No fsync: Tree syncs the filesystem once at the end.
			fi, err := out.Stat()
			if err != nil {
				return 0, false, err
			}
			return fi.Size(), true, nil
		}
		if noClone != nil && cloneUnsupported(cerr) {
			noClone.Store(true)
		}
	}
	// io.Copy between two *os.File uses copy_file_range: the kernel copies.
	n, err = io.Copy(out, in)
	if err != nil {
		return n, false, err
	}
	if sync {
		err = out.Sync()
	}
	return n, false, err
}

// matchDirNoCOW gives the new directory dst src's NOCOW flag.
func matchDirNoCOW(dst, src string) error {
	s, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // dropped while we walked: the copy skips its contents
	} else if err != nil {
		return err
	}
	defer s.Close()
	d, err := os.Open(dst)
	if err != nil {
		return err
	}
	defer d.Close()
	return volume.MatchNoCOW(d, s)
}

// syncFS commits everything written to the filesystem holding dir.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// cloneUnsupported reports whether FICLONE failed because the filesystem
// (or the pair of filesystems) cannot clone, as opposed to a real error.
func cloneUnsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EXDEV) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM)
}

// Chown gives path (a symlink itself, never its target) to owner, when set.
func Chown(path string, owner *syscall.Credential) error {
	if owner == nil {
		return nil
	}
	return os.Lchown(path, int(owner.Uid), int(owner.Gid))
}

// lowerThread runs the calling goroutine alone on its OS thread at the nice
// value nice, until the function it returns puts the thread's priority back
// and hands the thread back to the runtime. The thread must not end with
// the goroutine (as a locked thread whose goroutine exits does): a child
// started with Pdeathsig from that thread earlier would be killed. Only
// root can raise a priority back, so other users copy at their own.
func lowerThread(nice int) (restore func()) {
	if os.Geteuid() != 0 {
		return func() {}
	}
	runtime.LockOSThread()
	tid := unix.Gettid()
	// The raw getpriority returns 20 - nice.
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil || unix.Setpriority(unix.PRIO_PROCESS, tid, nice) != nil {
		runtime.UnlockOSThread()
		return func() {}
	}
	return func() {
		if unix.Setpriority(unix.PRIO_PROCESS, tid, 20-prio) == nil {
			runtime.UnlockOSThread()
		}
		// Else the thread stays locked and ends with the goroutine.
	}
}
