package proc

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Pidfd names one process for as long as it is open: a signal sent
// through it reaches that process or none, never one that took its PID
// after it exited and was reaped, which a kill(2) by PID can hit when
// another process (a postmaster) reaps its children meanwhile.
type Pidfd struct {
	Pid int
	fd  int
}

// OpenPidfd opens a pidfd for pid; an error wrapping ESRCH when there is
// no such process. It may be a later process with that PID: a caller that
// listed pid before checks it again once the pidfd is open.
func OpenPidfd(pid int) (*Pidfd, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	return &Pidfd{Pid: pid, fd: fd}, nil
}

// Signal sends sig to the process; nil when it has exited already.
func (p *Pidfd) Signal(sig syscall.Signal) error {
	if err := unix.PidfdSendSignal(p.fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %d: %w", p.Pid, err)
	}
	return nil
}

// Exited reports whether the process has exited, reaped or not: a pidfd
// is readable from its exit on, even while it waits as a zombie for a
// parent that is stopped.
func (p *Pidfd) Exited() bool {
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

func (p *Pidfd) Close() error { return unix.Close(p.fd) }
