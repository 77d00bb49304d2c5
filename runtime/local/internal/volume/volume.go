// Package volume says what the filesystem under the runtime's directory
// can do for a service's storage, and gives each service a volume of its
// own where it can: on btrfs with quotas enabled, a subvolume per service
// directory with a quota group that limits everything in it (data, WAL
// archive, snapshots). Elsewhere a volume is a plain directory and its
// limit is not enforced by the filesystem.
//
// Clones (FICLONE) need no help from this package: the copies in backup
// clone wherever Probe says Reflink, on btrfs and on XFS with reflink=1.
package volume

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Filesystem is what Probe found under a directory.
type Filesystem struct {
	Type    string // "btrfs", "xfs", "ext4", "tmpfs", or the magic number in hex
	Reflink bool   // files clone (FICLONE): copies and forks share blocks
	Quotas  bool   // btrfs quota groups are enabled: volumes get enforced limits
}

// String is the line dbcloud logs at start.
func (f Filesystem) String() string {
	clone, quota := "full copies", "limits not enforced"
	if f.Reflink {
		clone = "copy-on-write clones"
	}
	if f.Quotas {
		quota = "per-service quotas"
	}
	return fmt.Sprintf("%s (%s, %s)", f.Type, clone, quota)
}

// Superblock magic numbers (statfs f_type) of the filesystems that matter.
const (
	magicBtrfs = 0x9123683e
	magicXFS   = 0x58465342
	magicExt4  = 0xef53
	magicTmpfs = 0x01021994
)

// Probe reports what the filesystem holding dir offers; dir must exist
// and be writable (the clone test writes two small files and removes them).
func Probe(ctx context.Context, dir string) (Filesystem, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Filesystem{}, fmt.Errorf("probe %s: %w", dir, err)
	}
	f := Filesystem{Reflink: cloneWorks(dir)}
	switch st.Type {
	case magicBtrfs:
		f.Type = "btrfs"
		f.Quotas = btrfsQuotasEnabled(ctx, dir)
	case magicXFS:
		f.Type = "xfs"
	case magicExt4:
		f.Type = "ext4"
	case magicTmpfs:
		f.Type = "tmpfs"
	default:
		f.Type = fmt.Sprintf("0x%x", st.Type)
	}
	return f, nil
}

// cloneWorks clones a small file in dir: the only reliable test, since XFS
// clones only when made with reflink=1 and btrfs not across mounts.
func cloneWorks(dir string) bool {
	a, err := os.CreateTemp(dir, ".reflink-probe-*")
	if err != nil {
		return false
	}
	defer os.Remove(a.Name())
	defer a.Close()
	if _, err := a.Write([]byte("probe")); err != nil {
		return false
	}
	b, err := os.CreateTemp(dir, ".reflink-probe-*")
	if err != nil {
		return false
	}
	defer os.Remove(b.Name())
	defer b.Close()
	return unix.IoctlFileClone(int(b.Fd()), int(a.Fd())) == nil
}

// btrfsQuotasEnabled asks btrfs for the quota groups of dir; it fails when
// quotas are off.
func btrfsQuotasEnabled(ctx context.Context, dir string) bool {
	_, err := btrfs(ctx, "qgroup", "show", "--raw", dir)
	return err == nil
}

// Volumes creates, limits, measures and removes service volumes on one
// filesystem.
type Volumes struct {
	fs Filesystem
	mu sync.Mutex
	// limits is the limit this process last set on each volume, so that
	// a Create of a volume already at its limit (every start and every
	// wake of a service) runs no btrfs command on the start's path.
	limits map[string]setLimit
}

// setLimit is a limit set on one volume: a volume removed and made again
// at the same path is born again, and is another.
type setLimit struct {
	born  unix.StatxTimestamp
	limit int64
}

// New returns the volumes of a filesystem Probe described.
func New(fs Filesystem) *Volumes { return &Volumes{fs: fs, limits: map[string]setLimit{}} }

// Filesystem is what the volumes live on.
func (v *Volumes) Filesystem() Filesystem { return v.fs }

// Enforced says whether limits are enforced by the filesystem.
func (v *Volumes) Enforced() bool { return v.fs.Quotas }

// Create makes dir a volume limited to limit bytes (0: no limit). An
// existing volume keeps its contents and takes the new limit; an existing
// plain directory stays one (a service made before quotas were enabled
// keeps running, unlimited, and says so through Usage).
func (v *Volumes) Create(ctx context.Context, dir string, mode fs.FileMode, limit int64) error {
	if !v.fs.Quotas {
		return os.MkdirAll(dir, mode)
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
			return err
		}
		if _, err := btrfs(ctx, "subvolume", "create", dir); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if err := os.Chmod(dir, mode); err != nil {
		return err
	}
	if born, ok := birth(dir); ok && v.limitSet(dir, born, limit) {
		return nil
	}
	return v.SetLimit(ctx, dir, limit)
}

// birth is when dir was made, where the filesystem says (btrfs does).
func birth(dir string) (unix.StatxTimestamp, bool) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME, &st); err != nil || st.Mask&unix.STATX_BTIME == 0 {
		return unix.StatxTimestamp{}, false
	}
	return st.Btime, true
}

// limitSet reports whether this process set limit on the volume born at
// born at dir.
func (v *Volumes) limitSet(dir string, born unix.StatxTimestamp, limit int64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	got, ok := v.limits[dir]
	return ok && got.born == born && got.limit == limit
}

// recordLimit remembers the limit set on dir; forgetLimit forgets it.
func (v *Volumes) recordLimit(dir string, limit int64) {
	born, ok := birth(dir)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.limits == nil {
		v.limits = map[string]setLimit{}
	}
	if ok {
		v.limits[dir] = setLimit{born: born, limit: limit}
	} else {
		delete(v.limits, dir)
	}
}

func (v *Volumes) forgetLimit(dir string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.limits, dir)
}

// SetLimit sets the volume's limit on what it references (its files,
// counting blocks shared among them once); 0 removes the limit.
func (v *Volumes) SetLimit(ctx context.Context, dir string, limit int64) error {
	if !v.fs.Quotas {
		return nil
	}
	if ok, err := isSubvolume(dir); err != nil || !ok {
		return err
	}
	size := "none"
	if limit > 0 {
		size = strconv.FormatInt(limit, 10)
	}
	if _, err := btrfs(ctx, "qgroup", "limit", size, dir); err != nil {
		v.forgetLimit(dir)
		return err
	}
	v.recordLimit(dir, limit)
	return nil
}

// Usage is a volume's size as the filesystem accounts it.
type Usage struct {
	// Referenced is every block the volume's files use, a block shared by
	// several of them (a snapshot and the data it was cloned from)
	// counted once. What the limit applies to.
	Referenced int64
	// Exclusive is the part no other volume shares (a fork's own changes
	// after it was cloned from its parent).
	Exclusive int64
	// Limit is the enforced limit on Referenced, 0 for none.
	Limit int64
}

// ErrNotAccounted is Usage's answer for a volume the filesystem does not
// account (a plain directory): the caller measures the files instead.
var ErrNotAccounted = errors.New("volume: not accounted by the filesystem")

// Usage reads a volume's accounting. btrfs updates it when a transaction
// commits (every few seconds), so it lags fresh writes; fresh commits the
// filesystem first, which costs a flush of everything dirty on it: for
// volumes near their limit, not for every measurement.
func (v *Volumes) Usage(ctx context.Context, dir string, fresh bool) (Usage, error) {
	if !v.fs.Quotas {
		return Usage{}, ErrNotAccounted
	}
	if ok, err := isSubvolume(dir); err != nil {
		return Usage{}, err
	} else if !ok {
		return Usage{}, ErrNotAccounted
	}
	args := []string{"qgroup", "show", "--raw", "-re", "-f", dir}
	if fresh {
		args = append(args, "--sync")
	}
	out, err := btrfs(ctx, args...)
	if err != nil {
		return Usage{}, err
	}
	return parseQgroupShow(out)
}

// parseQgroupShow reads the level-0 row of `btrfs qgroup show --raw -re -f`:
//
//	Qgroupid    Referenced    Exclusive  Max referenced  Max exclusive   Path
//	--------    ----------    ---------  --------------  -------------   ----
//	0/256         20987904     20987904        52428800           none   s1
func parseQgroupShow(out []byte) (Usage, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "0/") {
			continue
		}
		var u Usage
		var err error
		if u.Referenced, err = strconv.ParseInt(f[1], 10, 64); err != nil {
			return Usage{}, fmt.Errorf("qgroup show: %q: %w", sc.Text(), err)
		}
		if u.Exclusive, err = strconv.ParseInt(f[2], 10, 64); err != nil {
			return Usage{}, fmt.Errorf("qgroup show: %q: %w", sc.Text(), err)
		}
		if f[3] != "none" {
			if u.Limit, err = strconv.ParseInt(f[3], 10, 64); err != nil {
				return Usage{}, fmt.Errorf("qgroup show: %q: %w", sc.Text(), err)
			}
		}
		return u, nil
	}
	return Usage{}, fmt.Errorf("qgroup show: no level-0 group in %q", out)
}

// Remove deletes a volume and everything in it. A subvolume goes with its
// quota group, so its limit does not linger; a missing one is no error.
func (v *Volumes) Remove(ctx context.Context, dir string) error {
	ok, err := isSubvolume(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || !ok {
		if err == nil {
			err = os.RemoveAll(dir)
		}
		return err
	}
	// Nested subvolumes (none are made today) would make this fail loudly
	// rather than leave half a volume.
	v.forgetLimit(dir)
	_, err = btrfs(ctx, "subvolume", "delete", "--commit-after", dir)
	return err
}

// isSubvolume reports whether dir is the root of a btrfs subvolume: its
// inode number is always 256 there.
func isSubvolume(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, err
	}
	if st.Type != magicBtrfs {
		return false, nil
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return false, err
	}
	sys, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.IsDir() && sys.Ino == 256, nil
}

// btrfs runs the btrfs command.
func btrfs(ctx context.Context, args ...string) ([]byte, error) {
	return command(ctx, "btrfs", args...)
}

// command runs a command and returns its standard output; its own message
// on standard error becomes the error's.
func command(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
