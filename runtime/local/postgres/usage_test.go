package postgres

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDirSize: the sizes of the regular files at every depth, symlinks
// not followed; a missing directory is an error.
func TestDirSize(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("PG_VERSION", 3)
	write("base/1/1259", 8192)
	write("base/5/2619", 16384)
	write("pg_wal/000000010000000000000001", 1<<20)
	outside := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(outside, make([]byte, 1<<22), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "base", "link")); err != nil {
		t.Fatal(err)
	}
	got, err := dirSize(dir)
	if want := int64(3 + 8192 + 16384 + 1<<20); err != nil || got != want {
		t.Errorf("dirSize = %d, %v; want %d", got, err, want)
	}
	if _, err := dirSize(filepath.Join(dir, "missing")); err == nil {
		t.Error("dirSize of a missing directory: no error")
	}
}
