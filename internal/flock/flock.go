// Package flock holds exclusive advisory locks on files, between the
// processes of one host: what control planes that share a runtime
// directory use to decide which of them does a piece of work there. The
// kernel drops a lock when its holder dies, even by kill -9, so another
// process can take the work over at once; nothing is left to expire.
package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Lock is a held lock; Unlock drops it.
type Lock struct {
	f *os.File
}

// TryLock takes the lock on path (creating the file, 0600) if no other
// holder has it, and reports whether it did. Holders are open files, not
// processes: a second TryLock of one path in one process fails too.
func TryLock(path string) (*Lock, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	return &Lock{f: f}, true, nil
}

// Wait takes the lock on path, polling until it is free or ctx ends.
func Wait(ctx context.Context, path string) (*Lock, error) {
	for {
		l, ok, err := TryLock(path)
		if err != nil || ok {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Unlock drops the lock. The file stays: removing it would let a later
// locker lock a new file while an old holder still holds the removed one.
func (l *Lock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
