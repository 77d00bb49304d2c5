package postgres

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"dbcloud/internal/flock"
	"dbcloud/runtime/local/internal/localtest"
)

// TestPool_SharedDirectoryOneKeeper: on a pool directory shared with
// another control plane that keeps the pool (holds its lock), Open leaves
// that plane's preparation in progress alone; once the keeper is gone,
// this process takes the pool over and removes what the keeper left.
func TestPool_SharedDirectoryOneKeeper(t *testing.T) {
	base := localtest.Base(t)
	pool := filepath.Join(base, "pool")
	if err := os.MkdirAll(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	keeper, ok, err := flock.TryLock(filepath.Join(pool, poolLockFile))
	if err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	inProgress := filepath.Join(pool, poolTmpPrefix+"keepers")
	if err := os.Mkdir(inProgress, 0o755); err != nil {
		t.Fatal(err)
	}
	m := mustInstances(t, base, 0)
	if err := m.Open(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(inProgress); err != nil {
		t.Fatalf("Open removed the keeper's preparation in progress: %v", err)
	}
	keeper.Unlock() // the keeper died
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(inProgress); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pool was not taken over and cleaned within 30 s of its keeper's end")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
