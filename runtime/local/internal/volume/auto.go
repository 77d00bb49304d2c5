package volume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// HostReserve is what an automatic image leaves free on the host's
// filesystem: a twentieth of it, and at least 4 GiB, on top of what the
// filesystem keeps for root (ext4's 5%, which free space as measured here
// already leaves out). It is for dbcloud's own store, its logs and the
// host, which live beside the image and which no tenant can then fill: the
// image is sparse, but it never grows past its size, so a full image
// still leaves this much of what was free when it was made.
func HostReserve(total int64) int64 { return max(total/20, 4<<30) }

// Reserve is the free space in the image that admission never hands out:
// btrfs writes metadata even to delete, so a full one is hard to free
// space on; a twentieth of it, and at least 512 MiB.
func (im Image) Reserve() int64 { return max(im.Size/20, 512<<20) }

// minAutoImage is the smallest automatic image worth making: below it
// (a host with less than the reserve free) there is no room to hand out,
// and the runtime stays on the host's filesystem with measured limits.
const minAutoImage = 2 << 30

// AutoImageSize is the size of an image made by default on a filesystem
// with free of total bytes free: the free space less HostReserve, so that
// a full image leaves the reserve. 0 when that is below minAutoImage.
func AutoImageSize(free, total int64) int64 {
	size := free - HostReserve(total)
	if size < minAutoImage {
		return 0
	}
	return size &^ (1<<20 - 1) // whole MiB
}

// ErrNoImage is AutoImage's answer when the runtime's directory cannot or
// should not be put on an image; the error says why, for the log.
var ErrNoImage = errors.New("no storage image")

// AutoImage is the image dbcloud makes by default for dir, the runtime's
// directory, kept in file: the one already there (its size as it is, so a
// restart neither grows nor shrinks it), else a new one sized by
// AutoImageSize from the host's free space now. It refuses (ErrNoImage,
// wrapped with the reason) where an image cannot be made or would hide
// data: not root, no loop devices or btrfs tools, too little free disk,
// or dir already holding services made before on the host's filesystem.
func AutoImage(file, dir string) (Image, error) {
	if os.Geteuid() != 0 {
		return Image{}, fmt.Errorf("%w: mounting one needs root", ErrNoImage)
	}
	for _, tool := range []string{"mkfs.btrfs", "btrfs", "mount", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			return Image{}, fmt.Errorf("%w: %s is not installed", ErrNoImage, tool)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return Image{}, fmt.Errorf("%w: no loop devices (/dev/loop-control: %v)", ErrNoImage, err)
	}
	if src, err := mountSource(dir); err != nil {
		return Image{}, fmt.Errorf("storage image: %w", err)
	} else if src == "" {
		// Unmounted, a runtime directory on an image is an empty mount
		// point; one with files in it is on the host's filesystem, and an
		// image mounted over it would hide its services.
		if used, err := hasEntries(dir); err != nil {
			return Image{}, fmt.Errorf("storage image: %w", err)
		} else if used {
			return Image{}, fmt.Errorf("%w: %s already holds services on the host's filesystem", ErrNoImage, dir)
		}
	}
	if fi, err := os.Stat(file); err == nil {
		return Image{File: file, Dir: dir, Size: fi.Size()}, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Image{}, fmt.Errorf("storage image: %w", err)
	}
	free, total, err := DiskSpace(filepath.Dir(file))
	if err != nil {
		return Image{}, fmt.Errorf("storage image: %w", err)
	}
	size := AutoImageSize(free, total)
	if size == 0 {
		return Image{}, fmt.Errorf("%w: %d MiB free on the host's filesystem, less its reserve of %d MiB, leaves less than %d MiB",
			ErrNoImage, free>>20, HostReserve(total)>>20, minAutoImage>>20)
	}
	return Image{File: file, Dir: dir, Size: size}, nil
}

// hasEntries reports whether dir exists with anything in it.
func hasEntries(dir string) (bool, error) {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return false, nil
	}
	return err == nil, err
}

// DiskSpace is the free space (for unprivileged writers, as PostgreSQL
// is) and the size of the filesystem holding dir, or its nearest existing
// ancestor.
func DiskSpace(dir string) (free, total int64, err error) {
	var st unix.Statfs_t
	for {
		err = unix.Statfs(dir, &st)
		if !errors.Is(err, unix.ENOENT) || dir == filepath.Dir(dir) {
			break
		}
		dir = filepath.Dir(dir)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}

// MountAuto mounts AutoImage's image; ErrNoImage when there is to be
// none. A mount that fails (no free loop device, a kernel without btrfs)
// is ErrNoImage too: the runtime runs on, with measured limits, and says
// so.
func MountAuto(ctx context.Context, file, dir string) (Image, error) {
	im, err := AutoImage(file, dir)
	if err != nil {
		return Image{}, err
	}
	_, statErr := os.Stat(file)
	if err := im.Mount(ctx); err != nil {
		if errors.Is(statErr, fs.ErrNotExist) {
			// Made just now and never used: the runtime goes on without
			// it, and a later start makes a new one if it can.
			os.Remove(file)
		}
		return Image{}, fmt.Errorf("%w: %v", ErrNoImage, err)
	}
	return im, nil
}
