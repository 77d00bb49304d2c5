package atomicfile_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"dbcloud/internal/atomicfile"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	for _, content := range []string{"first", "second"} {
		if err := atomicfile.Write(path, []byte(content), 0o600); err != nil {
			t.Fatalf("Write: %v", err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != content {
			t.Errorf("content = %q, want %q", got, content)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fi.Mode().Perm(), os.FileMode(0o600); got != want {
		t.Errorf("mode = %v, want %v", got, want)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(entries), 1; got != want {
		t.Errorf("dir has %d entries, want %d (temp files left behind?)", got, want)
	}
}

func TestWrite_Owner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's owner needs root")
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := atomicfile.Write(path, []byte("x"), 0o640, atomicfile.Owner(4242, 4343), atomicfile.NoDirSync()); err != nil {
		t.Fatalf("Write: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 4242 || st.Gid != 4343 || fi.Mode().Perm() != 0o640 {
		t.Errorf("owner %d:%d mode %v, want 4242:4343 mode -rw-r-----", st.Uid, st.Gid, fi.Mode().Perm())
	}
}

func TestWrite_MissingDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "f")
	if err := atomicfile.Write(path, []byte("x"), 0o600); err == nil {
		t.Fatal("Write into a missing directory: got nil error")
	}
}
