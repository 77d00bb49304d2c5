package backup

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"dbcloud/runtime/local/internal/volume"
	"dbcloud/runtime/local/internal/volume/volumetest"
)

// A copy keeps each file's and directory's NOCOW flag, whatever the
// destination's parent would give it, so that on btrfs every file clones
// (FICLONE refuses between a NOCOW and a copy-on-write file): a
// copy-on-write tree (a cluster made before data directories were NOCOW)
// copied under a NOCOW directory, and a NOCOW tree copied back under a
// copy-on-write one.
func TestCopyTreeKeepsNoCOW(t *testing.T) {
	root := volumetest.BtrfsDir(t, 256<<20)
	cowParent, nocowParent := filepath.Join(root, "cow"), filepath.Join(root, "nocow")
	for _, d := range []string{cowParent, nocowParent} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := volume.NoCOWDir(nocowParent); err != nil {
		t.Fatal(err)
	}
	// A mixed tree: a NOCOW data directory holding a copy-on-write file
	// (a WAL segment restored from the archive, say).
	files := map[string]string{"PG_VERSION": "15\n", "base/1/1259": strings.Repeat("x", 1<<20), "pg_wal/000000010000000000000001": strings.Repeat("w", 64<<10)}
	write := func(dir string, cowFile string) {
		for name, data := range files {
			path := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if name == cowFile {
				// Made empty, made copy-on-write, then written.
				f, err := os.Create(path)
				if err != nil {
					t.Fatal(err)
				}
				parent, _ := os.Open(cowParent)
				err = volume.MatchNoCOW(f, parent)
				parent.Close()
				if err != nil {
					t.Fatal(err)
				}
				f.Close()
			}
			if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	cowTree, nocowTree := filepath.Join(cowParent, "pgdata"), filepath.Join(nocowParent, "pgdata")
	write(cowTree, "")
	write(nocowTree, "pg_wal/000000010000000000000001")
	want := func(tree string) map[string]bool {
		m := map[string]bool{}
		filepath.Walk(tree, func(path string, _ os.FileInfo, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(tree, path)
			on, err := volume.IsNoCOW(path)
			if err != nil {
				t.Fatal(err)
			}
			m[rel] = on
			return nil
		})
		return m
	}
	if w := want(nocowTree); !w["."] || !w["base/1/1259"] || w["pg_wal/000000010000000000000001"] {
		t.Fatalf("setup: NOCOW flags %v", w)
	}
	if w := want(cowTree); w["."] || w["base/1/1259"] {
		t.Fatalf("setup: NOCOW flags %v", w)
	}

	for _, c := range []struct{ name, src, dst string }{
		{"copy-on-write tree under a NOCOW directory", cowTree, filepath.Join(nocowParent, "copy-of-cow")},
		{"NOCOW tree under a copy-on-write directory", nocowTree, filepath.Join(cowParent, "copy-of-nocow")},
	} {
		t.Run(c.name, func(t *testing.T) {
			stats, err := copyTree(context.Background(), c.src, c.dst, copyOptions{sync: true})
			if err != nil {
				t.Fatal(err)
			}
			if !stats.Reflinked || stats.Files != int64(len(files)) {
				t.Errorf("copy stats %+v: want all %d files cloned", stats, len(files))
			}
			src, dst := want(c.src), want(c.dst)
			for rel, on := range src {
				if dst[rel] != on {
					t.Errorf("%s: NOCOW %v in the copy, %v in the source", rel, dst[rel], on)
				}
			}
			for name, data := range files {
				if b, _ := os.ReadFile(filepath.Join(c.dst, name)); string(b) != data {
					t.Errorf("%s: copy holds %d bytes, want %d", name, len(b), len(data))
				}
			}
		})
	}
}
