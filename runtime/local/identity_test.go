package local

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"dbcloud"
	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/postgres"
)

// A crash right after a create claimed a pool entry (renamed it whole into
// the service's directory) loses nothing: the next ensure reads whose the
// entry is from the entry itself, records it, and moves the cluster into
// place; doing it again changes nothing.
func TestFinishClaim_AfterCrash(t *testing.T) {
	dir := t.TempDir()
	rt := &Runtime{cfg: Config{DataDir: dir}}
	const id = "abcdefghij"
	claimed := rt.claimDir(id)
	if err := os.MkdirAll(filepath.Join(claimed, "pgdata"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		filepath.Join(claimed, postgres.PoolIdentityFile): "p-0123456789abcdef\n",
		filepath.Join(claimed, "pgdata", "PG_VERSION"):    "15\n",
		filepath.Join(claimed, "prepare.log"):             "",
	} {
		if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if key, err := rt.ownerKey("other12345"); err != nil || key != "other12345" {
		t.Errorf("a service without a record or claim: key %q %v, want its ID", key, err)
	}
	for range 2 {
		key, err := rt.ownerKey(id)
		if err != nil || key != "p-0123456789abcdef" {
			t.Fatalf("key %q %v, want the claimed entry's", key, err)
		}
		if raw, err := os.ReadFile(rt.identityPath(id)); err != nil || string(raw) != "p-0123456789abcdef\n" {
			t.Errorf("record %q %v", raw, err)
		}
		if err := rt.finishClaim(id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(rt.serviceDir(id), "0", "pgdata", "PG_VERSION")); err != nil {
			t.Errorf("cluster not moved into place: %v", err)
		}
		if _, err := os.Stat(claimed); !os.IsNotExist(err) {
			t.Errorf("claimed entry left: %v", err)
		}
	}
}

// TestSettled_EndsTheClaimsHold: once a service that claimed a pool entry
// serves, the runtime tells the pool of its version, whose refill held
// off for it.
func TestSettled_EndsTheClaimsHold(t *testing.T) {
	dir := t.TempDir()
	m, err := postgres.NewInstances(postgres.Config{BinDir: pgbin.Dir(), PoolDir: filepath.Join(dir, "pool"), PoolSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	rt := &Runtime{cfg: Config{DataDir: dir, BinDir: pgbin.Dir()}, instances: m}
	svc := &dbcloud.Service{ID: "abcdefghij"}
	for _, d := range []string{filepath.Join(m.PoolDir, "ready-0123456789abcdef"), rt.serviceDir(svc.ID)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := m.Claim(context.Background(), rt.claimDir(svc.ID)); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if n := m.ClaimsStarting(); n != 1 {
		t.Fatalf("after the claim the pool waits for %d creates, want 1", n)
	}
	rt.settled(svc)
	if n := m.ClaimsStarting(); n != 0 {
		t.Errorf("the service serves, yet the pool's refill still waits for %d creates", n)
	}
}
