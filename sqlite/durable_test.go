package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"dbcloud"
)

// fakeSyncs replaces a groupSync's fsync: each call records how many waits
// had begun when it started, and blocks while hold is locked.
type fakeSyncs struct {
	g    *groupSync
	hold sync.Mutex
	mu   sync.Mutex
	// began[i] is g.issued when the i-th sync started.
	began []uint64
	fail  error
}

func newFakeSyncs(t *testing.T) *fakeSyncs {
	f := &fakeSyncs{g: newGroupSync(filepath.Join(t.TempDir(), "db-wal"))}
	if err := os.WriteFile(f.g.path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f.g.sync = func(*os.File) error {
		f.g.mu.Lock()
		issued := f.g.issued
		f.g.mu.Unlock()
		f.mu.Lock()
		f.began = append(f.began, issued)
		fail := f.fail
		f.mu.Unlock()
		f.hold.Lock()
		defer f.hold.Unlock()
		return fail
	}
	t.Cleanup(func() { f.g.close() })
	return f
}

func (f *fakeSyncs) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.began)
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

func (f *fakeSyncs) issued() uint64 {
	f.g.mu.Lock()
	defer f.g.mu.Unlock()
	return f.g.issued
}

// TestGroupSync_SharesOneSync: the commits made while an fsync runs all
// wait for one more fsync, not one each, and none is released by the
// fsync that began before it came.
func TestGroupSync_SharesOneSync(t *testing.T) {
	f := newFakeSyncs(t)
	f.hold.Lock()
	first := make(chan error, 1)
	go func() { first <- f.g.wait() }()
	waitFor(t, "the first sync to start", func() bool { return f.count() == 1 })

	const n = 20
	done := make(chan error, n)
	for range n {
		go func() { done <- f.g.wait() }()
	}
	waitFor(t, "every commit to wait", func() bool { return f.issued() == n+1 })
	f.hold.Unlock()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.began) != 2 {
		t.Fatalf("%d commits waiting during one fsync took %d more fsyncs, want 1 (began with %v waits)", n, len(f.began)-1, f.began)
	}
	if f.began[1] != n+1 {
		t.Errorf("the second fsync began after %d waits, want after all %d", f.began[1], n+1)
	}
}

// TestGroupSync_ErrorIsKept: after a failed fsync no later commit is
// promised durable, even if a later fsync succeeds.
func TestGroupSync_ErrorIsKept(t *testing.T) {
	f := newFakeSyncs(t)
	f.fail = errors.New("EIO")
	if err := f.g.wait(); err == nil || !errors.Is(err, f.fail) {
		t.Fatalf("wait with a failing fsync: %v, want EIO", err)
	}
	f.mu.Lock()
	f.fail = nil
	f.mu.Unlock()
	if err := f.g.wait(); err == nil {
		t.Fatal("a wait after a failed fsync succeeded; the pages it dropped may be gone")
	}
}

// openWithSnapshots opens a store whose WAL fsyncs also copy the WAL as it
// then is into disk: what a power loss would leave of it at worst, since a
// page written after the last fsync may never reach the disk.
func openWithSnapshots(t *testing.T) (s *Store, path string, disk func() []byte) {
	path = filepath.Join(t.TempDir(), "db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var mu sync.Mutex
	var synced []byte
	s.wal.sync = func(f *os.File) error {
		if err := f.Sync(); err != nil {
			return err
		}
		b, err := os.ReadFile(f.Name())
		mu.Lock()
		synced = b
		mu.Unlock()
		return err
	}
	return s, path, func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return synced
	}
}

// TestUpdate_DurableWhenItReturns: when Update returns, the commit is in
// the WAL as of an fsync, so a power loss right then keeps it. The test
// rebuilds the database from the database file and the WAL as last synced
// (SQLite's own recovery reads it) and finds the commit there.
func TestUpdate_DurableWhenItReturns(t *testing.T) {
	s, path, disk := openWithSnapshots(t)
	for i := range 3 {
		id := fmt.Sprintf("p%d", i)
		err := s.Update(t.Context(), func(tx dbcloud.Tx) error {
			return tx.InsertProject(&dbcloud.Project{ID: id, Name: id, PlanType: "FREE", Created: time.Now()})
		})
		if err != nil {
			t.Fatal(err)
		}
		if !inRecovered(t, path, disk(), id) {
			t.Fatalf("project %s, answered, is not in the WAL as last synced: a power loss would lose it", id)
		}
	}
}

// inRecovered copies the database file and wal into a new directory,
// opens it as SQLite recovers a database after a crash, and reports
// whether project id is there.
func inRecovered(t *testing.T, path string, wal []byte, id string) bool {
	t.Helper()
	dir := t.TempDir()
	main, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "db")
	if err := os.WriteFile(copyPath, main, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyPath+"-wal", wal, 0o600); err != nil {
		t.Fatal(err)
	}
	recovered, err := Open(t.Context(), copyPath)
	if err != nil {
		t.Fatal(err)
	}
	defer recovered.Close()
	err = recovered.View(t.Context(), func(tx dbcloud.Tx) error {
		_, err := tx.FindProject(id)
		return err
	})
	if err != nil && !dbcloud.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestUpdate_FailedWriteSparesOthers: writes that fail, concurrent with
// ones that succeed and sharing their fsyncs, take none of them down.
func TestUpdate_FailedWriteSparesOthers(t *testing.T) {
	s, path, disk := openWithSnapshots(t)
	const n = 40
	refused := errors.New("refused")
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs[i] = s.Update(context.Background(), func(tx dbcloud.Tx) error {
				id := fmt.Sprintf("p%d", i)
				if err := tx.InsertProject(&dbcloud.Project{ID: id, Name: id, PlanType: "FREE", Created: time.Now()}); err != nil {
					return err
				}
				if i%2 == 1 {
					return refused
				}
				return nil
			})
		})
	}
	wg.Wait()
	wal := disk()
	for i, err := range errs {
		id := fmt.Sprintf("p%d", i)
		switch {
		case i%2 == 1 && !errors.Is(err, refused):
			t.Errorf("write %d: %v, want its own error", i, err)
		case i%2 == 0 && err != nil:
			t.Errorf("write %d failed beside failing writes: %v", i, err)
		case inRecovered(t, path, wal, id) != (i%2 == 0):
			t.Errorf("write %d (error %v): in the synced WAL %v, want %v", i, err, i%2 != 0, i%2 == 0)
		}
	}
}
