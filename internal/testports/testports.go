// Package testports hands tests ports that no other test on this machine
// holds, in any process or checkout: each port (or block of ports) is
// claimed by an exclusive lock on a file under os.TempDir(), which this
// process holds until it exits. Ports come from below the kernel's
// ephemeral range (32768 and up on Linux), so an outgoing connection never
// takes one between a test's claim and its server's bind.
package testports

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// The ranges tests take ports from: single ports (API listeners, test
// servers) and blocks (a dbcloud server's range of service ports).
const (
	singleLo, singleHi = 20000, 23000
	blockLo, blockHi   = 23000, 32750
	// BlockSize is how many ports a block holds.
	BlockSize = 50
)

// claims are the lock files this process holds, by first port; kept open
// (the lock lives as long as the descriptor) until Release or the
// process's exit.
type claims struct {
	mu    sync.Mutex
	files map[int]*os.File
	next  map[int]int // per range start, where the next search begins
}

// process is the one set of claims of this test process: a lock is held
// per process, so the state is the process's too.
var process = claims{files: map[int]*os.File{}, next: map[int]int{}}

// Port returns a loopback port that this process alone holds and that was
// free when claimed.
func Port() (int, error) { return process.claim(singleLo, singleHi, 1) }

// Block returns the first of BlockSize consecutive loopback ports that
// this process alone holds and that were free when claimed.
func Block() (int, error) { return process.claim(blockLo, blockHi, BlockSize) }

// TB is the part of testing.TB these helpers use.
type TB interface {
	Helper()
	Fatal(...any)
	Cleanup(func())
}

// MustPort is Port for a test: it fails the test when no port is left,
// and releases the port when the test and its cleanups are done (register
// it before the cleanups that stop what uses it).
func MustPort(tb TB) int {
	tb.Helper()
	p, err := Port()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { Release(p) })
	return p
}

// MustBlock is Block for a test, released like MustPort's port.
func MustBlock(tb TB) int {
	tb.Helper()
	p, err := Block()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { Release(p) })
	return p
}

// Release gives back the port (or block) claimed at first, once nothing
// uses it any more.
func Release(first int) {
	process.mu.Lock()
	defer process.mu.Unlock()
	if f, ok := process.files[first]; ok {
		f.Close()
		delete(process.files, first)
	}
}

func (c *claims) claim(lo, hi, size int) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dir := filepath.Join(os.TempDir(), "dbcloud-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, fmt.Errorf("claim ports: %w", err)
	}
	slots := (hi - lo) / size
	// Start where this process stopped last time, offset by its PID so
	// that processes starting together try different ports first.
	start, ok := c.next[lo]
	if !ok {
		start = os.Getpid() % slots
	}
	for i := range slots {
		slot := (start + i) % slots
		first := lo + slot*size
		if _, mine := c.files[first]; mine {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(first)+".lock"), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return 0, fmt.Errorf("claim ports: %w", err)
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close() // another process holds it
			continue
		}
		if !bindable(first, size) {
			f.Close() // something outside the tests uses it
			continue
		}
		c.files[first] = f
		c.next[lo] = slot + 1
		return first, nil
	}
	return 0, fmt.Errorf("claim ports: every port in %d-%d is held", lo, hi-1)
}

// bindable reports whether each of the ports can be listened on now.
func bindable(first, size int) bool {
	for p := first; p < first+size; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}
