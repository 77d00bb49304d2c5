package volume

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Image is a btrfs filesystem in a file, loop-mounted at a directory: how
// a host whose own filesystem neither clones nor limits (ext4) gives the
// runtime one that does. The file is sparse: it takes from the host only
// what the services write, up to Size.
type Image struct {
	File string // the image file, on the host's filesystem
	Dir  string // its mount point, the runtime's directory
	Size int64  // bytes; a larger Size than the file's grows the filesystem
}

// minImageSize is the smallest image mkfs.btrfs formats with its default
// profile (DUP metadata); below it mkfs fails with a less clear message.
const minImageSize = 256 << 20

// Mount makes Dir the image's filesystem, with quotas enabled: the first
// time it creates and formats the file; afterwards it mounts it again
// (after a reboot) or finds it mounted (after a restart of dbcloud: the
// mount stays, as the services on it keep running). Needs root.
func (im Image) Mount(ctx context.Context) error {
	if im.Size < minImageSize {
		return fmt.Errorf("storage image %s: size %d is below the minimum of %d MiB", im.File, im.Size, minImageSize>>20)
	}
	if err := os.MkdirAll(im.Dir, 0o711); err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	mounted, err := mountSource(im.Dir)
	if err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	if mounted == "" {
		if err := im.create(ctx); err != nil {
			return err
		}
		// Quota accounting is brought up to date at each commit: every
		// 5 s rather than btrfs's default 30, so usage lags less.
		if err := run(ctx, "mount", "-o", "loop,commit=5", im.File, im.Dir); err != nil {
			return fmt.Errorf("storage image: %w", err)
		}
	} else if !strings.HasPrefix(mounted, "/dev/loop") {
		return fmt.Errorf("storage image: %s is already a mount point of %s, not of the image %s", im.Dir, mounted, im.File)
	}
	if err := im.grow(ctx); err != nil {
		return err
	}
	// Idempotent: enabling quotas that are on changes nothing.
	if _, err := btrfs(ctx, "quota", "enable", im.Dir); err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	return nil
}

// create makes and formats the image file unless it exists.
func (im Image) create(ctx context.Context) error {
	if _, err := os.Stat(im.File); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("storage image: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(im.File), 0o700); err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	// Formatted under a temporary name and renamed last: a crash midway
	// leaves no file that looks like a usable image.
	tmp := im.File + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	err = f.Truncate(im.Size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = run(ctx, "mkfs.btrfs", "-q", tmp)
	}
	if err == nil {
		err = os.Rename(tmp, im.File)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("storage image: %w", err)
	}
	return nil
}

// grow extends the file and the filesystem to Size when the operator
// raised it; a smaller Size leaves the image as it is (shrinking could
// fail halfway on a full image).
func (im Image) grow(ctx context.Context) error {
	fi, err := os.Stat(im.File)
	if err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	if im.Size <= fi.Size() {
		return nil
	}
	if err := os.Truncate(im.File, im.Size); err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	// The loop device keeps the old size until told to read it again.
	dev, err := mountSource(im.Dir)
	if err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	if err := run(ctx, "losetup", "--set-capacity", dev); err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	if _, err := btrfs(ctx, "filesystem", "resize", "max", im.Dir); err != nil {
		return fmt.Errorf("storage image: %w", err)
	}
	return nil
}

// Unmount detaches the image (tests, and an operator's clean-up: the
// services on it must be stopped first).
func (im Image) Unmount(ctx context.Context) error {
	return run(ctx, "umount", im.Dir)
}

// Remove unmounts the image if it is mounted at Dir and deletes its file,
// for a teardown once nothing runs on it; it reports whether there was an
// image. Something else mounted at Dir is left alone.
func (im Image) Remove(ctx context.Context) (bool, error) {
	src, err := mountSource(im.Dir)
	if err != nil {
		return false, fmt.Errorf("storage image: %w", err)
	}
	if strings.HasPrefix(src, "/dev/loop") {
		if err := im.Unmount(ctx); err != nil {
			return false, fmt.Errorf("storage image: %w", err)
		}
	} else if src != "" {
		return false, nil
	}
	if err := os.Remove(im.File); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("storage image: %w", err)
	}
	return true, nil
}

// mountSource returns what is mounted at dir ("" for nothing), from
// /proc/self/mountinfo.
func mountSource(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	return mountSourceIn(info, abs), nil
}

// mountSourceIn finds dir's entry in a mountinfo text; the last one wins,
// as the last mount on a point hides the ones before it.
//
//	"36 25 7:0 / /var/lib/dbcloud rw,relatime shared:9 - btrfs /dev/loop0 rw,space_cache=v2"
func mountSourceIn(mountinfo []byte, dir string) string {
	source := ""
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, postFields := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(postFields) < 2 {
			continue
		}
		if unescapeMountPath(fields[4]) == dir {
			source = postFields[1]
		}
	}
	return source
}

// unescapeMountPath undoes mountinfo's octal escapes of space, tab,
// newline and backslash.
func unescapeMountPath(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// run runs a command for its effect.
func run(ctx context.Context, name string, args ...string) error {
	_, err := command(ctx, name, args...)
	return err
}
