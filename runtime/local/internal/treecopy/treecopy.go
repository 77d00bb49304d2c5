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
	"path"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/tenantfs"
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
	// Unshared makes every file a copy of its bytes that shares no block
	// with its source, even where the filesystem clones: a new source for
	// many clones (the pool's template, package postgres).
	Unshared bool
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
//
// The source is often a data directory its service's OS user writes while
// root copies it: it is read through tenantfs, so a link is copied as a
// link and never followed (not even a directory swapped for one mid-walk),
// and only regular files are read. The copy's directories stay root's
// until the copy is complete and are then given to Owner deepest first, so
// no path root writes through can be changed by that user meanwhile.
func Tree(ctx context.Context, src, dst string, opt Options) (Stats, error) {
	root, err := tenantfs.OpenDir(src)
	if err != nil {
		return Stats{}, fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	defer root.Close()
	rootInfo, err := root.Lstat(".")
	if err != nil {
		return Stats{}, fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &copier{ctx: ctx, root: root, dst: dst, opt: opt, jobs: make(chan job, 64)}
	var wg sync.WaitGroup
	for range copyWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.work(cancel)
		}()
	}
	walkErr := c.dir(root, ".", rootInfo, false)
	close(c.jobs)
	wg.Wait()
	if c.firstErr != nil {
		return Stats{}, fmt.Errorf("copy %s to %s: %w", src, dst, c.firstErr)
	}
	if walkErr != nil {
		return Stats{}, fmt.Errorf("copy %s to %s: %w", src, dst, walkErr)
	}
	// Deepest first: each directory is given away while its parent is
	// still root's, so the owner can rename nothing on the way.
	for i := len(c.dirs) - 1; i >= 0; i-- {
		if err := Chown(c.dirs[i], opt.Owner); err != nil {
			return Stats{}, fmt.Errorf("copy %s to %s: %w", src, dst, err)
		}
	}
	var stats Stats
	switch {
	case opt.Sync && c.clones.Load() > 0:
		if err := syncFS(dst); err != nil {
			return stats, fmt.Errorf("copy %s to %s: %w", src, dst, err)
		}
	case opt.Sync:
		for i := len(c.dirs) - 1; i >= 0; i-- {
			if err := atomicfile.SyncDir(c.dirs[i]); err != nil {
				return stats, err
			}
		}
	}
	stats.Files, stats.Bytes = c.files.Load(), c.bytes.Load()
	stats.Reflinked = stats.Files > 0 && c.clones.Load() == stats.Files
	return stats, nil
}

// job is one regular file to copy, named relative to the source's root.
type job struct {
	rel  string
	mode fs.FileMode
}

// copier is one Tree copy: the walk feeds regular files to the workers.
type copier struct {
	ctx  context.Context
	root *tenantfs.Dir
	dst  string
	opt  Options
	jobs chan job
	dirs []string // made in dst, in walk order

	files, bytes, clones atomic.Int64
	noClone              atomic.Bool
	errOnce              sync.Once
	firstErr             error
}

// work copies the files the walk sends until it is done.
func (c *copier) work(cancel context.CancelFunc) {
	if c.opt.Nice > 0 {
		defer lowerThread(c.opt.Nice)()
	}
	for j := range c.jobs {
		if c.ctx.Err() != nil {
			continue
		}
		n, cloned, err := c.copyFile(j)
		if errors.Is(err, fs.ErrNotExist) {
			continue // dropped while we walked
		}
		if err != nil {
			c.errOnce.Do(func() { c.firstErr = err; cancel() })
			continue
		}
		c.files.Add(1)
		c.bytes.Add(n)
		if cloned {
			c.clones.Add(1)
		}
	}
}

func (c *copier) copyFile(j job) (int64, bool, error) {
	in, err := c.root.Open(j.rel)
	if err != nil {
		return 0, false, err
	}
	defer in.Close()
	return copyOpen(in, filepath.Join(c.dst, j.rel), j.mode, c.opt.Owner, c.opt.Sync, &c.noClone, c.opt.Unshared)
}

// dir copies the directory d (rel to the source's root) and, unless
// skipContents, what is in it.
func (c *copier) dir(d *tenantfs.Dir, rel string, info fs.FileInfo, skipContents bool) error {
	target := filepath.Join(c.dst, rel)
	if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
		return err
	}
	// Mkdir applies the umask; the data directory must be 0700 or 0750
	// exactly, so set the mode as it was.
	if err := os.Chmod(target, info.Mode().Perm()); err != nil {
		return err
	}
	// Files made in it later (by the copy, or by the PostgreSQL that runs
	// on it) take its flag, as they did in the source.
	if err := matchDirNoCOW(target, d.File()); err != nil {
		return err
	}
	c.dirs = append(c.dirs, target)
	if skipContents {
		return nil
	}
	entries, err := d.ReadDir()
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	for _, fi := range entries {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if err := c.entry(d, path.Join(rel, fi.Name()), fi); err != nil {
			return err
		}
	}
	return nil
}

// entry copies one entry of d.
func (c *copier) entry(d *tenantfs.Dir, rel string, fi fs.FileInfo) error {
	skipContents := false
	if c.opt.Skip != nil {
		var skip bool
		if skip, skipContents = c.opt.Skip(rel, fs.FileInfoToDirEntry(fi)); skip {
			return nil
		}
	}
	switch {
	case fi.IsDir():
		sub, err := d.OpenDir(fi.Name())
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		defer sub.Close()
		return c.dir(sub, rel, fi, skipContents)
	case fi.Mode()&fs.ModeSymlink != 0:
		link, err := d.Readlink(fi.Name())
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		target := filepath.Join(c.dst, rel)
		if err := os.Symlink(link, target); err != nil {
			return err
		}
		return Chown(target, c.opt.Owner)
	case fi.Mode().IsRegular():
		select {
		case c.jobs <- job{rel: rel, mode: fi.Mode().Perm()}:
			return nil
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	default:
		return nil // sockets, FIFOs and the like are not data
	}
}

// File copies one regular file to a new file dst, by FICLONE unless
// noClone says the filesystem cannot (it is set at the first refusal).
// src is opened through tenantfs: it may lie in a directory a service's
// OS user writes (a WAL archive), and a link or FIFO there is refused.
func File(src, dst string, mode fs.FileMode, owner *syscall.Credential, sync bool, noClone *atomic.Bool) (n int64, cloned bool, err error) {
	in, err := tenantfs.Open(src)
	if err != nil {
		return 0, false, err
	}
	defer in.Close()
	return copyOpen(in, dst, mode, owner, sync, noClone, false)
}

// copyOpen copies the open file in to a new file dst; unshared copies
// its bytes (Options.Unshared).
func copyOpen(in *os.File, dst string, mode fs.FileMode, owner *syscall.Credential, sync bool, noClone *atomic.Bool, unshared bool) (n int64, cloned bool, err error) {
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
	if unshared {
		// The copy takes the flag too, so that what clones it can be
		// made where clones of in could.
		if err := volume.MatchNoCOW(out, in); err != nil {
			return 0, false, err
		}
		// Through a buffer: copy_file_range, which io.Copy would use,
		// clones on btrfs. The wrappers hide ReadFrom and WriteTo.
		n, err = io.CopyBuffer(struct{ io.Writer }{out}, struct{ io.Reader }{in}, make([]byte, 1<<20))
		if err == nil && sync {
			err = out.Sync()
		}
		return n, false, err
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

// matchDirNoCOW gives the new directory dst the NOCOW flag of the open
// directory src.
func matchDirNoCOW(dst string, src *os.File) error {
	d, err := os.Open(dst)
	if err != nil {
		return err
	}
	defer d.Close()
	return volume.MatchNoCOW(d, src)
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
