// Package volumetest gives tests a btrfs filesystem of their own.
package volumetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"dbcloud/runtime/local/internal/volume"
)

// BtrfsDir mounts a btrfs image of size bytes for the test, unmounted when
// it ends, and returns its root. It skips where no image can be mounted
// (not root, no loop devices); CI runs as root with loop devices, and a
// missing mkfs.btrfs fails, since scripts/deps.sh installs btrfs-progs.
func BtrfsDir(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a btrfs image needs root")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no loop devices here: /dev/loop-control is missing")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Fatal("mkfs.btrfs is missing: scripts/deps.sh installs btrfs-progs")
	}
	base := t.TempDir()
	im := volume.Image{File: filepath.Join(base, "img"), Dir: filepath.Join(base, "mnt"), Size: size}
	if err := im.Mount(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := im.Unmount(context.Background()); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return im.Dir
}
