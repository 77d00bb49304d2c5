package treecopy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTree_NiceLeavesNoThreadLowered: a copy at a nice value copies the
// files and their modes, and leaves no thread of the process at that
// value afterwards (the threads are handed back at their old priority, not
// ended: ending one would kill children started from it with Pdeathsig).
func TestTree_NiceLeavesNoThreadLowered(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root raises a priority back; others copy at their own")
	}
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "copy")
	if err := os.Mkdir(filepath.Join(src, "base"), 0o700); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"PG_VERSION", "base/1", "base/2"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(strings.Repeat("x", i*1000)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	stats, err := Tree(context.Background(), src, dst, Options{Nice: 13})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Files != 3 {
		t.Errorf("copied %d files, want 3", stats.Files)
	}
	if fi, err := os.Stat(filepath.Join(dst, "base")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("base: %v %v, want mode 0700", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "base/2")); err != nil || len(b) != 2000 {
		t.Errorf("base/2: %d bytes, %v", len(b), err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		raw, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "stat"))
		if err != nil {
			continue // ended meanwhile
		}
		// Field 19 is nice; the command (field 2) may hold spaces, so
		// count from the closing parenthesis.
		fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
		if len(fields) > 16 && fields[16] == "13" {
			t.Errorf("thread %s still at nice 13 after the copy", task.Name())
		}
	}
}
