package volume

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// NoCOWDir marks a directory on btrfs so that what is made in it is NOCOW,
// and does nothing (no error) on a filesystem without the flag.
func TestNoCOWDir(t *testing.T) {
	plain := t.TempDir()
	if err := NoCOWDir(plain); err != nil {
		t.Fatalf("NoCOWDir on %s: %v", plain, err)
	}
	if fs, err := Probe(context.Background(), plain); err == nil && fs.Type != "btrfs" {
		if on, err := IsNoCOW(plain); err != nil || on {
			t.Errorf("NOCOW %v, %v on %s", on, err, fs.Type)
		}
	}

	if os.Geteuid() != 0 {
		t.Skip("mounting a btrfs image needs root")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("mkfs.btrfs is missing (scripts/deps.sh installs btrfs-progs)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no loop devices here: /dev/loop-control is missing")
	}
	base := t.TempDir()
	im := Image{File: filepath.Join(base, "img"), Dir: filepath.Join(base, "mnt"), Size: 256 << 20}
	if err := im.Mount(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Unmount(context.Background()) })
	dir := filepath.Join(im.Dir, "work")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := NoCOWDir(dir); err != nil {
		t.Fatal(err)
	}
	// What initdb makes there: a directory, files in it.
	if err := os.MkdirAll(filepath.Join(dir, "pgdata", "base"), 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "pgdata", "base", "1259")
	if err := os.WriteFile(file, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "pgdata"), file} {
		if on, err := IsNoCOW(p); err != nil || !on {
			t.Errorf("%s: NOCOW %v, %v; want it inherited", p, on, err)
		}
	}
	if on, err := IsNoCOW(im.Dir); err != nil || on {
		t.Errorf("the image's root: NOCOW %v, %v; only the marked directory should be", on, err)
	}
}
