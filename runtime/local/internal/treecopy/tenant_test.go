package treecopy

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"dbcloud/runtime/local/internal/localtest"
)

// A data directory is copied (snapshot, fork, backup) as root while its
// service's OS user may change it. Links it made are copied as links; an
// entry it swaps for a link while the walk runs (played here from the
// Skip hook, which runs as each entry is reached) is never followed: no
// root-only byte reaches the copy, which then belongs to that user.
func TestTree_TenantSwapsForLinks(t *testing.T) {
	for _, c := range []struct{ name, rel, swap string }{
		{"Directory", "base", "mv base base.old && ln -s SECRET base"},
		{"File", "PG_VERSION", "mv PG_VERSION v.old && ln -s SECRET/key PG_VERSION"},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := localtest.ServiceUser(t)
			base := localtest.Base(t)
			src, dst := filepath.Join(base, "pgdata"), filepath.Join(base, "copy")
			secretDir := filepath.Join(base, "secret")
			for _, d := range []string{src, filepath.Join(src, "base"), secretDir} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			for p, text := range map[string]string{
				filepath.Join(secretDir, "key"):    "root only secret\n",
				filepath.Join(src, "PG_VERSION"):   "15\n",
				filepath.Join(src, "base", "1259"): "tenant data\n",
			} {
				if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range []string{src, filepath.Join(src, "base"), filepath.Join(src, "PG_VERSION"), filepath.Join(src, "base", "1259")} {
				if err := os.Chown(p, int(id.UID), int(id.GID)); err != nil {
					t.Fatal(err)
				}
			}
			localtest.AsUser(t, id, "ln -s "+secretDir+" "+filepath.Join(src, "planted"))
			swapped := false
			skip := func(rel string, d fs.DirEntry) (bool, bool) {
				// The tenant's move, timed as it would have to be: the
				// walk has listed the entry and reaches it now.
				if rel == c.rel {
					localtest.AsUser(t, id, "cd "+src+" && "+strings.ReplaceAll(c.swap, "SECRET", secretDir))
					swapped = true
				}
				return false, false
			}
			_, err := Tree(context.Background(), src, dst, Options{Skip: skip, Owner: id.Credential()})
			t.Logf("Tree: %v", err)
			if !swapped {
				t.Fatalf("the walk never reached %s", c.rel)
			}
			filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return nil
				}
				if b, _ := os.ReadFile(p); strings.Contains(string(b), "root only") {
					t.Errorf("%s in the copy holds the root-only file's bytes", p)
				}
				return nil
			})
			if fi, err := os.Lstat(filepath.Join(dst, "planted")); err == nil && fi.Mode()&fs.ModeSymlink == 0 {
				t.Errorf("planted link copied as %v, want a link", fi.Mode())
			}
		})
	}
}

// A copy with an owner ends with every entry that owner's, directories
// included, and the links themselves (not their targets) re-owned.
func TestTree_Owner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	base := t.TempDir()
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	if err := os.MkdirAll(filepath.Join(src, "a", "b"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a", "b", "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(base, "target")
	if err := os.WriteFile(target, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(src, "a", "link")); err != nil {
		t.Fatal(err)
	}
	const uid = 4243
	if _, err := Tree(context.Background(), src, dst, Options{Owner: &syscall.Credential{Uid: uid, Gid: uid}}); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{".", "a", "a/b", "a/b/f", "a/link"} {
		fi, err := os.Lstat(filepath.Join(dst, rel))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || st.Gid != uid {
			t.Errorf("%s: uid %d gid %d, want %d", rel, st.Uid, st.Gid, uid)
		}
	}
	if fi, _ := os.Lstat(filepath.Join(dst, "a", "b")); fi.Mode().Perm() != 0o750 {
		t.Errorf("a/b mode %v, want 0750", fi.Mode().Perm())
	}
	var st syscall.Stat_t
	if err := syscall.Stat(target, &st); err != nil || st.Uid != 0 {
		t.Errorf("the link's target re-owned: uid %d, %v", st.Uid, err)
	}
}
