package volume_test

import (
	"dbcloud/runtime/local/internal/volume"
	"dbcloud/runtime/local/internal/volume/volumetest"

	"context"
	"os"
	"path/filepath"
	"testing"
)

// NoCOWDir marks a directory on btrfs so that what is made in it is NOCOW,
// and does nothing (no error) on a filesystem without the flag.
func TestNoCOWDir(t *testing.T) {
	plain := t.TempDir()
	if err := volume.NoCOWDir(plain); err != nil {
		t.Fatalf("NoCOWDir on %s: %v", plain, err)
	}
	if fs, err := volume.Probe(context.Background(), plain); err == nil && fs.Type != "btrfs" {
		if on, err := volume.IsNoCOW(plain); err != nil || on {
			t.Errorf("NOCOW %v, %v on %s", on, err, fs.Type)
		}
	}

	root := volumetest.BtrfsDir(t, 256<<20)
	dir := filepath.Join(root, "work")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := volume.NoCOWDir(dir); err != nil {
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
		if on, err := volume.IsNoCOW(p); err != nil || !on {
			t.Errorf("%s: NOCOW %v, %v; want it inherited", p, on, err)
		}
	}
	if on, err := volume.IsNoCOW(root); err != nil || on {
		t.Errorf("the image's root: NOCOW %v, %v; only the marked directory should be", on, err)
	}
}
