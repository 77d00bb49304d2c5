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
}

// New returns the volumes of a filesystem Probe described.
func New(fs Filesystem) *Volumes { return &Volumes{fs: fs} }

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
	return v.SetLimit(ctx, dir, limit)
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
	_, err := btrfs(ctx, "qgroup", "limit", size, dir)
	return err
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
// commits (within 30 s, or at a sync), so it lags fresh writes slightly.
func (v *Volumes) Usage(ctx context.Context, dir string) (Usage, error) {
	if !v.fs.Quotas {
		return Usage{}, ErrNotAccounted
	}
	if ok, err := isSubvolume(dir); err != nil {
		return Usage{}, err
	} else if !ok {
		return Usage{}, ErrNotAccounted
	}
	out, err := btrfs(ctx, "qgroup", "show", "--raw", "-re", "-f", dir)
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
