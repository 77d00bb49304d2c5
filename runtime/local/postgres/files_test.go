package postgres

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestWriteConfig_LeavesWhatIsUnchanged: a start rewrites an instance's
// config files, certificate and key, and each rewrite costs an fsync on
// the path of every start and wake: a file already as it would be written
// is left as it is (the same inode), while a changed setting, content or
// mode, or a link put in a file's place, is written again.
func TestWriteConfig_LeavesWhatIsUnchanged(t *testing.T) {
	base := t.TempDir()
	m := &Instances{}
	s := mustSpec(t, base, "conf")
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	names := []string{certFile, keyFile, hbaFile, identFile, confFile}
	inodes := func() map[string]uint64 {
		out := map[string]uint64{}
		for _, n := range names {
			fi, err := os.Lstat(s.ConfPath(n))
			if err != nil {
				t.Fatal(err)
			}
			out[n] = fi.Sys().(*syscall.Stat_t).Ino
		}
		return out
	}
	if err := m.writeConfig(s); err != nil {
		t.Fatal(err)
	}
	first := inodes()
	if err := m.writeConfig(s); err != nil {
		t.Fatal(err)
	}
	for n, ino := range inodes() {
		if ino != first[n] {
			t.Errorf("%s was written again with nothing changed", n)
		}
	}

	s.Settings["work_mem"] = "8MB"
	if err := os.Chmod(s.ConfPath(keyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	hba := s.ConfPath(hbaFile)
	if err := os.Rename(hba, filepath.Join(base, "hba-elsewhere")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(base, "hba-elsewhere"), hba); err != nil {
		t.Fatal(err)
	}
	ident := s.ConfPath(identFile)
	data, err := os.ReadFile(ident)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ident, []byte(strings.Repeat("#", len(data))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.writeConfig(s); err != nil {
		t.Fatal(err)
	}
	again := inodes()
	for _, n := range []string{keyFile, hbaFile, identFile, confFile} {
		if again[n] == first[n] {
			t.Errorf("%s was left as it was after a change", n)
		}
	}
	if again[certFile] != first[certFile] {
		t.Errorf("%s was written again with nothing changed", certFile)
	}
	if fi, err := os.Lstat(hba); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("%s after a link was put there: %v %v", hbaFile, fi.Mode(), err)
	}
	if fi, _ := os.Stat(s.ConfPath(keyFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", fi.Mode().Perm())
	}
	if conf, _ := os.ReadFile(s.ConfPath(confFile)); !strings.Contains(string(conf), "work_mem = '8MB'") {
		t.Errorf("postgresql.conf without the changed setting:\n%s", conf)
	}
	if got, _ := os.ReadFile(ident); string(got) == strings.Repeat("#", len(data)) {
		t.Error("pg_ident.conf changed under dbcloud was left so")
	}
}
