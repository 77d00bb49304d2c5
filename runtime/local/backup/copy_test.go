package backup

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"dbcloud/runtime/local/internal/volume"
)

func TestCopyTree(t *testing.T) {
	src := filepath.Join(t.TempDir(), "pgdata")
	files := map[string]string{
		"PG_VERSION": "15\n", "global/pg_control": "control", "base/1/1259": strings.Repeat("x", 1<<20),
		"base/1/pg_internal.init": "skip", "base/pgsql_tmp/pgsql_tmp1.0": "skip", "postmaster.pid": "skip",
		"postmaster.opts": "skip", "pg_wal/000000010000000000000001": "skip", "pg_wal/archive_status/x.ready": "skip",
		"pg_replslot/s/state": "skip", "pg_stat_tmp/global.stat": "skip", "pg_stat/pgstat.stat": "kept",
		"backup_label": "skip", "recovery.signal": "skip", "dbcloud_sealed": "skip", "dbcloud_end_reason": "skip",
	}
	for name, data := range files {
		path := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(src, 0o750)
	if err := os.Symlink("/elsewhere", filepath.Join(src, "pg_tblspc_link")); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "copy")
	stats, err := copyTree(context.Background(), src, dst, copyOptions{skip: backupSkip, sync: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	filepath.Walk(dst, func(path string, info os.FileInfo, err error) error {
		rel, _ := filepath.Rel(dst, path)
		if info.Mode().IsRegular() || info.Mode()&os.ModeSymlink != 0 {
			got = append(got, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(got)
	want := []string{"PG_VERSION", "base/1/1259", "global/pg_control", "pg_stat/pgstat.stat", "pg_tblspc_link"}
	if !slices.Equal(got, want) {
		t.Errorf("copied %q, want %q", got, want)
	}
	for _, dir := range []string{"pg_wal", "pg_replslot", "pg_stat_tmp"} {
		if fi, err := os.Stat(filepath.Join(dst, dir)); err != nil || !fi.IsDir() {
			t.Errorf("%s: the directory must stay, empty: %v", dir, err)
		}
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o750 {
		t.Errorf("root mode %v, want 0750 (PostgreSQL checks it)", fi.Mode().Perm())
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "base/1/1259")); len(b) != 1<<20 {
		t.Errorf("copied file has %d bytes", len(b))
	}
	if l, _ := os.Readlink(filepath.Join(dst, "pg_tblspc_link")); l != "/elsewhere" {
		t.Errorf("symlink copied as %q", l)
	}
	if stats.Files != 4 || stats.Bytes != 1<<20+int64(len("15\ncontrolkept")) {
		t.Errorf("stats %+v", stats)
	}
	// Where the filesystem clones, every file is a clone; elsewhere none.
	if fs, err := volume.Probe(context.Background(), filepath.Dir(dst)); err != nil {
		t.Fatal(err)
	} else if stats.Reflinked != fs.Reflink {
		t.Errorf("cloned %v on %s", stats.Reflinked, fs)
	}

	if _, err := copyTree(context.Background(), src, dst, copyOptions{}); err == nil {
		t.Error("copy onto an existing directory succeeded")
	}
}
