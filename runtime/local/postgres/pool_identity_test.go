package postgres

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/internal/localtest"
	"dbcloud/runtime/local/internal/osuser"
)

// TestPool_ClaimTakesClusterAndIdentity: with Identities, each pool entry
// is prepared as an OS user of its own, and Claim hands a create the
// cluster with that user, already its owner, in one rename; a second take
// from a pool that is not full grows the target (a burst) and waits for the
// cluster being prepared instead of reporting none.
func TestPool_ClaimTakesClusterAndIdentity(t *testing.T) {
	ctx := t.Context()
	base := localtest.Base(t)
	m, users, claimed := openIdentityPool(t, base, "dbct", 1, 4)
	waitPoolReady(t, m, 1)
	for i := range 2 {
		dst := filepath.Join(base, "svc"+strconv.Itoa(i))
		key, ok, err := m.Claim(ctx, dst)
		if err != nil || !ok {
			t.Fatalf("claim %d: %v %v", i, ok, err)
		}
		*claimed = append(*claimed, key)
		who, found, err := users.Lookup(key)
		if err != nil || !found {
			t.Fatalf("claim %d: identity %q: %v %v", i, key, found, err)
		}
		fi, err := os.Stat(filepath.Join(dst, "pgdata", "PG_VERSION"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != who.UID {
			t.Errorf("claim %d: cluster owned by uid %d, want its identity's %d", i, st.Uid, who.UID)
		}
		if raw, err := os.ReadFile(filepath.Join(dst, PoolIdentityFile)); err != nil || strings.TrimSpace(string(raw)) != key {
			t.Errorf("claim %d: identity file %q %v, want %q", i, raw, err, key)
		}
		if i == 0 && m.PoolTarget() != 1 {
			t.Errorf("a take from a full pool changed the target to %d", m.PoolTarget())
		}
	}
	if (*claimed)[0] == (*claimed)[1] {
		t.Errorf("two claims got the same identity %s", (*claimed)[0])
	}
	if got := m.PoolTarget(); got != 2 {
		t.Errorf("target after a take from a pool not full: %d, want 2 (doubled)", got)
	}
}

// TestPool_DrainRemovesEntriesAndIdentities: a teardown's drain leaves
// nothing of the pool on the host: no cluster, no template, and no OS user
// of its entries (removing the directory alone left one per entry).
func TestPool_DrainRemovesEntriesAndIdentities(t *testing.T) {
	m, users, _ := openIdentityPool(t, localtest.Base(t), "dbcd", 2, 2)
	waitPoolReady(t, m, 2)
	var keys []string
	for _, name := range m.readyEntries() {
		key := PoolIdentityKey(strings.TrimPrefix(name, poolReadyPrefix))
		if _, found, err := users.Lookup(key); err != nil || !found {
			t.Fatalf("identity of entry %s: %v %v", name, found, err)
		}
		keys = append(keys, key)
	}
	if err := m.DrainPool(t.Context()); err != nil {
		t.Fatal(err)
	}
	left, err := os.ReadDir(m.PoolDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		if e.Name() != poolLockFile {
			t.Errorf("after the drain, the pool holds %s", e.Name())
		}
	}
	for _, key := range keys {
		if _, found, err := users.Lookup(key); err != nil || found {
			t.Errorf("after the drain, identity %s: found %v, %v", key, found, err)
		}
	}
}

// openIdentityPool opens a pool of size (growing to maxSize) whose entries
// get OS users named with prefix, in base; it skips the test without root,
// which making OS users needs. Test cleanup removes the entries left and
// the users of the claims the test appends to claimed.
func openIdentityPool(t *testing.T, base, prefix string, size, maxSize int) (*Instances, *osuser.Manager, *[]string) {
	t.Helper()
	m, users, claimed := newIdentityPool(t, base, prefix, size, maxSize)
	if err := m.Open(t.Context()); err != nil {
		t.Fatal(err)
	}
	return m, users, claimed
}

// newIdentityPool is openIdentityPool before Open.
func newIdentityPool(t *testing.T, base, prefix string, size, maxSize int) (*Instances, *osuser.Manager, *[]string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making OS users needs root")
	}
	logger := localtest.Logger(t)
	users := osuser.New(prefix+strconv.Itoa(os.Getpid()%100000)+"-", osuser.SystemTools(), logger)
	m, err := NewInstances(Config{BinDir: pgbin.Dir(), PoolDir: filepath.Join(base, "pool"), PoolSize: size,
		PoolMaxSize: maxSize, Identities: users, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	claimed := new([]string)
	t.Cleanup(func() {
		ctx := context.Background()
		// What the pool still holds goes with its users.
		if err := m.DrainPool(ctx); err != nil {
			t.Error(err)
		}
		for _, key := range *claimed {
			if err := users.Remove(ctx, key); err != nil {
				t.Error(err)
			}
		}
	})
	return m, users, claimed
}
