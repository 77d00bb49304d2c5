package proc

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// WatchExit calls onExit once pid exits, and returns a function that ends
// the watch (onExit is then never called; safe to call more than once).
//
// It holds a pidfd: that names this one process even if its PID is reused
// later, it becomes readable as soon as the process exits (a zombie
// included), and it works for any process, not only a child of ours: a
// postmaster adopted after a restart of dbcloud is not one. The pidfd sits
// in Go's poller, so the exit wakes the watch at once, with no polling
// tick and no thread blocked per watch.
func WatchExit(pid int, onExit func()) (stop func(), err error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watch pid %d: pidfd_open: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))
	// A file the poller did not take has no deadlines: its Read below
	// would fail at once and the exit go unreported.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("watch pid %d: pidfd not pollable: %w", pid, err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("watch pid %d: %w", pid, err)
	}
	go func() {
		// Read waits in the poller until the callback reports the pidfd
		// readable; closing the file (stop) ends it with an error instead.
		err := rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, perr := unix.Poll(fds, 0)
			return perr == nil && n > 0
		})
		if err == nil {
			onExit()
		}
	}()
	return sync.OnceFunc(func() { f.Close() }), nil
}
