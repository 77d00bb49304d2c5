package postgres

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/internal/localtest"
)

// TestManager_VersionPools: a spec naming another version's binaries gets
// its data directory from that version's pool, not the main one, and its
// postmaster runs that version's postgres. The other version here is the
// host's own binaries under another path (a link), which is all that tells
// versions apart to Instances: a 15 host has no second version to use.
func TestManager_VersionPools(t *testing.T) {
	ctx := context.Background()
	base := localtest.Base(t)
	m := mustInstances(t, base, 0) // no pool of its own: any take would be inline
	other := filepath.Join(base, "other-version-bin")
	if err := os.Symlink(pgbin.Dir(), other); err != nil {
		t.Fatal(err)
	}
	v, err := NewInstances(Config{BinDir: other, PoolDir: filepath.Join(base, "pool-other"), PoolSize: 1, Logger: localtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	m.AddVersion(v)
	// A new service claims from its version's pool (the local runtime's
	// claim, with OS identities).
	if m.Version(other) != v || m.Version(m.BinDir) != m || m.Version("") != m {
		t.Errorf("Version(%s) is not the other version's Instances, or Version of the main or none is not m", other)
	}
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	var ready []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ready = v.readyEntries(); len(ready) >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other version's pool has no ready entry after 60 s: Open did not start its refill")
		}
	}
	want := systemIdentifier(t, filepath.Join(v.PoolDir, ready[0], "pgdata"))

	s := mustSpec(t, base, "other")
	s.BinDir = other
	pid := mustCreate(t, m, &s)
	if got := systemIdentifier(t, s.PGData()); got != want {
		t.Errorf("instance system identifier %d, want the other version's pool entry's %d", got, want)
	}
	if _, err := os.Stat(filepath.Join(v.PoolDir, ready[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the other version's entry %s is still in its pool: %v", ready[0], err)
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	if exe, _, _ := strings.Cut(string(cmdline), "\x00"); exe != filepath.Join(other, "postgres") {
		t.Errorf("the postmaster runs %q, want the other version's %q", exe, filepath.Join(other, "postgres"))
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}
