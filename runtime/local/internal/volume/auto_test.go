package volume

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The default image leaves the host a twentieth of its filesystem, at
// least 4 GiB, and is not made when less than 2 GiB would be left for it.
func TestAutoImageSize(t *testing.T) {
	const gib = int64(1) << 30
	cases := []struct {
		name        string
		free, total int64
		want, resrv int64
	}{
		{name: "LargeHost", free: 80 * gib, total: 252 * gib, want: 80*gib - 252*gib/20, resrv: 252 * gib / 20},
		{name: "SmallHostKeeps4GiB", free: 20 * gib, total: 30 * gib, want: 16 * gib, resrv: 4 * gib},
		{name: "TooLittleFree", free: 5 * gib, total: 30 * gib, want: 0, resrv: 4 * gib},
		{name: "JustEnough", free: 6 * gib, total: 30 * gib, want: 2 * gib, resrv: 4 * gib},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := HostReserve(c.total); got != c.resrv {
				t.Errorf("HostReserve(%d GiB) = %d MiB, want %d MiB", c.total/gib, got>>20, c.resrv>>20)
			}
			got := AutoImageSize(c.free, c.total)
			if got != c.want&^(1<<20-1) {
				t.Fatalf("AutoImageSize(free %d GiB, total %d GiB) = %d MiB, want %d MiB", c.free/gib, c.total/gib, got>>20, c.want>>20)
			}
			if got > 0 && c.free-got < HostReserve(c.total) {
				t.Errorf("a full image leaves %d MiB of the host free, less than the reserve %d MiB", (c.free-got)>>20, HostReserve(c.total)>>20)
			}
		})
	}
}

// An image is never mounted over a runtime directory that already holds
// services on the host's filesystem: they would vanish under it.
func TestAutoImage_RefusesDirectoryInUse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("AutoImage refuses before looking at the directory when not root")
	}
	base := t.TempDir()
	dir := filepath.Join(base, "runtime")
	if err := os.MkdirAll(filepath.Join(dir, "services"), 0o711); err != nil {
		t.Fatal(err)
	}
	_, err := AutoImage(dir+".img", dir)
	if !errors.Is(err, ErrNoImage) {
		t.Fatalf("AutoImage over a directory with services: %v, want ErrNoImage", err)
	}
	t.Logf("refused: %v", err)
	if _, err := os.Stat(dir + ".img"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an image file was made: %v", err)
	}
}

// Once made, the image keeps its size across restarts, whatever the
// host's free space is then (it took some of it).
func TestAutoImage_KeepsExistingSize(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("AutoImage needs root")
	}
	base := t.TempDir()
	dir, file := filepath.Join(base, "runtime"), filepath.Join(base, "runtime.img")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(3 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	im, err := AutoImage(file, dir)
	if errors.Is(err, ErrNoImage) {
		t.Skipf("no image on this host: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	if im.Size != 3<<30 || im.File != file || im.Dir != dir {
		t.Fatalf("image = %+v, want the existing file's 3 GiB", im)
	}
}
