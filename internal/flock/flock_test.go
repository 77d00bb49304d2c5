package flock_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"dbcloud/internal/flock"
)

// TestTryLock: one holder at a time, and the lock is free again once the
// holder unlocks.
func TestTryLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	a, ok, err := flock.TryLock(path)
	if err != nil || !ok {
		t.Fatalf("first TryLock: %v %v", ok, err)
	}
	if _, ok, err := flock.TryLock(path); err != nil || ok {
		t.Fatalf("second TryLock while held: %v %v, want false", ok, err)
	}
	if err := a.Unlock(); err != nil {
		t.Fatal(err)
	}
	b, ok, err := flock.TryLock(path)
	if err != nil || !ok {
		t.Fatalf("TryLock after Unlock: %v %v", ok, err)
	}
	b.Unlock()
}

// TestLockDiesWithHolder: a process killed with SIGKILL while it holds
// the lock leaves it free.
func TestLockDiesWithHolder(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock(1) not installed")
	}
	path := filepath.Join(t.TempDir(), "lock")
	cmd := exec.Command("flock", "--no-fork", "-x", path, "sleep", "60")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	// Poll until the child holds it, then kill it by its PID.
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, ok, err := flock.TryLock(path)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		l.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("flock(1) never took the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	l, ok, err := flock.TryLock(path)
	if err != nil || !ok {
		t.Fatalf("TryLock after the holder was killed: %v %v", ok, err)
	}
	l.Unlock()
}
