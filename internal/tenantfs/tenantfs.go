// Package tenantfs is how dbcloud, running as root, touches files in a
// directory a service's OS user can write: its data directory, socket,
// log, WAL archive, pooler and proxy directories. That user may have a
// shell (the threat model in docs/security.md), so whatever such a
// directory holds was possibly put there to trick root: a symbolic link
// (root would read, write, truncate or chown its target: a file of the
// host or of another service), a FIFO (root's read would block until
// someone writes), a device, a directory or a file linked from elsewhere
// where dbcloud expects its own regular file.
//
// Every operation here resolves names relative to a descriptor of the
// directory and refuses every symbolic link on the way (openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS; where the kernel lacks openat2,
// O_NOFOLLOW component by component), opens without blocking, and checks
// with fstat that what it opened is a regular file with no other link.
// The directory itself is named by a path whose components belong to root
// (the service's directories sit in root-owned ones); its last component
// must not be a symbolic link either.
package tenantfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrSymlink is the answer when a symbolic link stands where a name is
// resolved: it is refused, never followed.
var ErrSymlink = errors.New("symbolic link refused")

// ErrNotRegular is the answer for a FIFO, device, socket or directory where
// a regular file is expected, and for a regular file with more than one
// link (a hard link to a file outside the directory).
var ErrNotRegular = errors.New("not a regular file of this directory")

// ErrNotSocket is DialUnix's answer when name is not a socket.
var ErrNotSocket = errors.New("not a socket")

// ErrTooLarge is ReadFile's answer for a file past MaxReadFile.
var ErrTooLarge = errors.New("file too large")

// MaxReadFile bounds ReadFile: the files it reads (pid files, state files,
// small configs) are a few hundred bytes, and one grown by a tenant must
// not exhaust dbcloud's memory.
const MaxReadFile = 1 << 20

// Dir is an open directory that names are resolved beneath.
type Dir struct {
	f    *os.File
	path string
	// noOpenat2 makes every resolution take the O_NOFOLLOW-per-component
	// path: the one kernels without openat2 take (tests cover both).
	noOpenat2 bool
}

// OpenDir opens the directory at path; a symbolic link there is refused.
func OpenDir(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, pathError("open", path, componentError(unix.AT_FDCWD, path, err))
	}
	return &Dir{f: os.NewFile(uintptr(fd), path), path: path}, nil
}

// Close releases the directory's descriptor.
func (d *Dir) Close() error { return d.f.Close() }

// Path is the directory's path, for messages.
func (d *Dir) Path() string { return d.path }

func (d *Dir) fd() int { return int(d.f.Fd()) }

// File is the directory's descriptor, for ioctls on the directory itself
// (its NOCOW flag); it stays d's to close.
func (d *Dir) File() *os.File { return d.f }

// Open opens the regular file name for reading.
func (d *Dir) Open(name string) (*os.File, error) {
	return d.OpenFile(name, os.O_RDONLY, 0)
}

// OpenFile opens the regular file name (created with perm when flag has
// O_CREATE). O_TRUNC is applied only once the file is known to be a
// regular file of this directory, so nothing else is ever truncated.
func (d *Dir) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	trunc := flag&os.O_TRUNC != 0
	fd, err := d.openat(name, flag&^os.O_TRUNC, uint32(perm.Perm()))
	if err != nil {
		return nil, pathError("open", d.join(name), err)
	}
	if err := checkRegular(fd); err != nil {
		unix.Close(fd)
		return nil, pathError("open", d.join(name), err)
	}
	// O_NONBLOCK served the open; a regular file ignores it, but the
	// descriptor may be handed to a child process as its output.
	if err := setBlocking(fd); err != nil {
		unix.Close(fd)
		return nil, pathError("fcntl", d.join(name), err)
	}
	if trunc {
		if err := unix.Ftruncate(fd, 0); err != nil {
			unix.Close(fd)
			return nil, pathError("truncate", d.join(name), err)
		}
	}
	return os.NewFile(uintptr(fd), d.join(name)), nil
}

// ReadFile returns the contents of the regular file name, at most
// MaxReadFile bytes (ErrTooLarge past that).
func (d *Dir) ReadFile(name string) ([]byte, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxReadFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxReadFile {
		return nil, pathError("read", d.join(name), ErrTooLarge)
	}
	return data, nil
}

// Truncate cuts the regular file name to size.
func (d *Dir) Truncate(name string, size int64) error {
	f, err := d.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Lstat describes name itself (a symbolic link is described, not
// followed); only the directories on the way must not be links.
func (d *Dir) Lstat(name string) (fs.FileInfo, error) {
	parent, base, err := d.parent(name)
	if err != nil {
		return nil, pathError("lstat", d.join(name), err)
	}
	defer parent.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(parent.fd(), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, pathError("lstat", d.join(name), err)
	}
	return newFileInfo(base, &st), nil
}

// Remove removes name (a file, a link itself, or an empty directory).
func (d *Dir) Remove(name string) error {
	parent, base, err := d.parent(name)
	if err != nil {
		return pathError("remove", d.join(name), err)
	}
	defer parent.Close()
	err = unix.Unlinkat(parent.fd(), base, 0)
	if errors.Is(err, unix.EISDIR) {
		err = unix.Unlinkat(parent.fd(), base, unix.AT_REMOVEDIR)
	}
	return pathError("remove", d.join(name), err)
}

// Rename renames oldname to newname, both beneath d. Neither is followed:
// a link is moved, or replaced, as itself.
func (d *Dir) Rename(oldname, newname string) error {
	from, fromBase, err := d.parent(oldname)
	if err != nil {
		return pathError("rename", d.join(oldname), err)
	}
	defer from.Close()
	to, toBase, err := d.parent(newname)
	if err != nil {
		return pathError("rename", d.join(newname), err)
	}
	defer to.Close()
	return pathError("rename", d.join(oldname), unix.Renameat(from.fd(), fromBase, to.fd(), toBase))
}

// Lchown gives name itself (a link is re-owned, not its target) to uid and
// gid.
func (d *Dir) Lchown(name string, uid, gid int) error {
	parent, base, err := d.parent(name)
	if err != nil {
		return pathError("chown", d.join(name), err)
	}
	defer parent.Close()
	return pathError("chown", d.join(name), unix.Fchownat(parent.fd(), base, uid, gid, unix.AT_SYMLINK_NOFOLLOW))
}

// Readlink returns the target of the link name, which is read, never
// followed.
func (d *Dir) Readlink(name string) (string, error) {
	parent, base, err := d.parent(name)
	if err != nil {
		return "", pathError("readlink", d.join(name), err)
	}
	defer parent.Close()
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(parent.fd(), base, buf)
		if err != nil {
			return "", pathError("readlink", d.join(name), err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// OpenDir opens the directory name beneath d.
func (d *Dir) OpenDir(name string) (*Dir, error) {
	if name == "." {
		// A new open file description, not a dup: its offset (ReadDir
		// reads through it) is its own.
		fd, err := unix.Openat(d.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, pathError("open", d.path, err)
		}
		return &Dir{f: os.NewFile(uintptr(fd), d.path), path: d.path, noOpenat2: d.noOpenat2}, nil
	}
	fd, err := d.openat(name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, pathError("open", d.join(name), err)
	}
	path := d.join(name)
	return &Dir{f: os.NewFile(uintptr(fd), path), path: path, noOpenat2: d.noOpenat2}, nil
}

// ReadDir describes every entry of d (links described, not followed),
// sorted by name. Entries that vanish while it reads are left out.
func (d *Dir) ReadDir() ([]fs.FileInfo, error) {
	// A descriptor of its own: reading moves the offset.
	own, err := d.OpenDir(".")
	if err != nil {
		return nil, err
	}
	defer own.Close()
	names, err := own.f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	infos := make([]fs.FileInfo, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(own.fd(), n, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
			continue
		} else if err != nil {
			return nil, pathError("lstat", d.join(n), err)
		}
		infos = append(infos, newFileInfo(n, &st))
	}
	sortInfos(infos)
	return infos, nil
}

// ChownTree gives everything beneath d, and d itself last, to uid and gid.
// Each entry is re-owned relative to its directory's descriptor without
// following it, and a directory is entered only if it still is one (a
// directory swapped for a link while the walk runs is an error): no path
// the tenant can change is resolved. It returns how many entries it
// re-owned below d.
func (d *Dir) ChownTree(uid, gid int) (int, error) {
	infos, err := d.ReadDir()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, fi := range infos {
		if fi.IsDir() {
			sub, err := d.OpenDir(fi.Name())
			if errors.Is(err, fs.ErrNotExist) {
				continue
			} else if err != nil {
				return n, err
			}
			m, err := sub.ChownTree(uid, gid)
			sub.Close()
			n += m + 1
			if err != nil {
				return n, err
			}
			continue
		}
		if err := unix.Fchownat(d.fd(), fi.Name(), uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
			return n, pathError("chown", d.join(fi.Name()), err)
		}
		n++
	}
	return n, pathError("chown", d.path, unix.Fchown(d.fd(), uid, gid))
}

func (d *Dir) join(name string) string { return filepath.Join(d.path, name) }

// parent opens the directory holding name and returns it with name's last
// component.
func (d *Dir) parent(name string) (*Dir, string, error) {
	if err := checkName(name); err != nil {
		return nil, "", err
	}
	dir, base := filepath.Split(name)
	if dir == "" {
		p, err := d.OpenDir(".")
		return p, base, err
	}
	p, err := d.OpenDir(filepath.Clean(dir))
	if err != nil {
		return nil, "", errors.Unwrap(err)
	}
	return p, base, nil
}

// openat opens name beneath d: no symbolic link anywhere, no "..", no
// waiting on a FIFO, no controlling terminal.
func (d *Dir) openat(name string, flag int, mode uint32) (int, error) {
	if err := checkName(name); err != nil {
		return -1, err
	}
	if flag&unix.O_PATH != 0 {
		flag |= unix.O_NOFOLLOW | unix.O_CLOEXEC // openat2 refuses any other flag with O_PATH
	} else {
		flag |= unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY
	}
	if flag&unix.O_CREAT == 0 {
		mode = 0 // openat2 refuses a mode without O_CREAT
	}
	if !d.noOpenat2 {
		fd, err := unix.Openat2(d.fd(), name, &unix.OpenHow{
			Flags:   uint64(flag),
			Mode:    uint64(mode),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		// ENOSYS: a kernel before 5.6; EPERM: a seccomp filter that
		// does not know the call.
		// ENOTDIR: a link where a directory was wanted, or a file on
		// the way; the walk by component tells which.
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.ENOTDIR) {
			return fd, linkError(err)
		}
	}
	return d.openByComponent(name, flag, mode)
}

// openByComponent is openat for kernels without openat2: each directory on
// the way is opened with O_NOFOLLOW relative to the previous one.
func (d *Dir) openByComponent(name string, flag int, mode uint32) (int, error) {
	parts := strings.Split(filepath.Clean(name), "/")
	cur, owned := d.fd(), -1
	defer func() {
		if owned >= 0 {
			unix.Close(owned)
		}
	}()
	for _, p := range parts[:len(parts)-1] {
		fd, err := unix.Openat(cur, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, componentError(cur, p, err)
		}
		if owned >= 0 {
			unix.Close(owned)
		}
		cur, owned = fd, fd
	}
	last := parts[len(parts)-1]
	fd, err := unix.Openat(cur, last, flag, mode)
	if err != nil {
		return -1, componentError(cur, last, err)
	}
	return fd, nil
}

// componentError names a symbolic link as such: opening one with
// O_NOFOLLOW answers ELOOP, or ENOTDIR when a directory was asked for.
func componentError(dirfd int, name string, err error) error {
	if errors.Is(err, unix.ENOTDIR) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return ErrSymlink
		}
	}
	return linkError(err)
}

// linkError turns the kernel's answer to a refused link (ELOOP; EXDEV for
// a ".." that would leave the directory) into ErrSymlink.
func linkError(err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return ErrSymlink
	}
	return err
}

// checkName refuses names that are not relative paths beneath the
// directory; openat2 would too, the fallback relies on this.
func checkName(name string) error {
	if name == "" || filepath.IsAbs(name) {
		return fmt.Errorf("%q: not a name beneath the directory: %w", name, fs.ErrInvalid)
	}
	for _, p := range strings.Split(name, "/") {
		if p == ".." {
			return fmt.Errorf("%q: not a name beneath the directory: %w", name, ErrSymlink)
		}
	}
	return nil
}

// checkRegular accepts a regular file with one link only.
func checkRegular(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink > 1 {
		return ErrNotRegular
	}
	return nil
}

func setBlocking(fd int) error {
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&^unix.O_NONBLOCK)
	return err
}

// pathError wraps err (nil stays nil) with the operation and path, as the
// os package does, so errors.Is(err, fs.ErrNotExist) keeps working.
func pathError(op, path string, err error) error {
	if err == nil {
		return nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}

// fileInfo is an fs.FileInfo from fstatat.
type fileInfo struct {
	name string
	st   unix.Stat_t
}

func newFileInfo(name string, st *unix.Stat_t) *fileInfo { return &fileInfo{name: name, st: *st} }

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return fi.st.Size }
func (fi *fileInfo) ModTime() time.Time { return time.Unix(fi.st.Mtim.Unix()) }
func (fi *fileInfo) IsDir() bool        { return fi.Mode().IsDir() }
func (fi *fileInfo) Sys() any           { return &fi.st }

func (fi *fileInfo) Mode() fs.FileMode {
	m := fs.FileMode(fi.st.Mode & 0o777)
	switch fi.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	if fi.st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if fi.st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if fi.st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func sortInfos(infos []fs.FileInfo) {
	slices.SortFunc(infos, func(a, b fs.FileInfo) int { return strings.Compare(a.Name(), b.Name()) })
}
