package local

import (
	"os"
	"path/filepath"
	"testing"

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
