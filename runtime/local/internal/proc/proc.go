// Package proc is the runtime's one process supervisor: it spawns the
// processes that serve tenants (postmasters, PgBouncer, endpoint proxies)
// in sessions of their own so they outlive dbcloud, reaps the ones it
// started, recognises the ones it adopts after a restart by what they run
// rather than by a PID that may have been reused, and stops them by PID
// with a ladder of signals.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"dbcloud/internal/tenantfs"
)

// PollInterval is how often exits and readiness are checked. A start takes
// tens of milliseconds, so a coarse poll would dominate it.
const PollInterval = 5 * time.Millisecond

// Child is a process this supervisor started: only its parent can reap
// it, and until reaped a dead process is a zombie that still holds its PID
// and looks alive to kill(pid, 0).
type Child struct {
	PID    int
	exited chan struct{}
	err    error // valid once exited is closed
}

// Exited is closed once the child has exited and been reaped.
func (c *Child) Exited() <-chan struct{} { return c.exited }

// Err is how the child exited; valid once Exited is closed.
func (c *Child) Err() error { return c.err }

func (c *Child) done() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// Supervisor starts and reaps processes. Its state is the set of children
// it started; processes adopted after a restart are not its children and
// are watched through /proc instead.
type Supervisor struct {
	mu       sync.Mutex
	children map[int]*Child
}

// NewSupervisor returns a supervisor with no children.
func NewSupervisor() *Supervisor {
	return &Supervisor{children: map[int]*Child{}}
}

// Spec says how to run one process.
type Spec struct {
	// Path is the program, Args its arguments (without argv[0]).
	Path string
	Args []string
	Dir  string
	Env  []string
	// Credential is who the process runs as; nil is dbcloud's own user.
	Credential *syscall.Credential
	// LogPath receives stdout and stderr, appended; the file is made and
	// owned by Credential. Its directory is that user's, so the file is
	// opened through tenantfs: a link or FIFO put there is refused.
	LogPath string
	// JoinCgroups are cgroup.procs files the process writes its own PID
	// into before the program runs (a tiny sh wrapper, which then execs
	// it), so everything it forks is confined from birth: cgroup v1 has no
	// way to spawn straight into a group.
	JoinCgroups []string
	// CgroupDir, when set, is a cgroup v2 directory the process is spawned
	// straight into (clone3 with CLONE_INTO_CGROUP): confined from its
	// first instruction, with no wrapper. It excludes JoinCgroups.
	CgroupDir string
	// NoFile, when set, raises the open-file limit (to the hard limit when
	// that is lower); Go would otherwise hand down its original soft limit.
	NoFile int
}

// wrapper joins the cgroups named by its first arguments, sets the
// open-file limit, and execs the rest: sh -c wrapper NAME N FILE... NOFILE PROGRAM ARGS...
const wrapper = `n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ >"$1"; shift; n=$((n-1)); done; ` +
	`if [ "$1" -gt 0 ]; then ulimit -n "$1" 2>/dev/null || ulimit -n "$(ulimit -Hn)"; fi; shift; exec "$@"`

// Spawn starts the process in a session of its own, so no signal aimed at
// dbcloud's terminal or process group reaches it and it survives dbcloud's
// exit, and reaps it when it exits. It returns the child and the offset in
// LogPath at which its output starts.
func (s *Supervisor) Spawn(spec Spec) (*Child, int64, error) {
	var logFile *os.File
	var logStart int64
	if spec.LogPath != "" {
		f, err := tenantfs.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, 0, fmt.Errorf("run %s: log: %w", spec.Path, err)
		}
		defer f.Close() // the child has its own descriptor
		if c := spec.Credential; c != nil {
			if err := f.Chown(int(c.Uid), int(c.Gid)); err != nil {
				return nil, 0, err
			}
		}
		if logStart, err = f.Seek(0, io.SeekEnd); err != nil {
			return nil, 0, err
		}
		logFile = f
	}
	// Not exec.CommandContext: the process must outlive the request.
	cmd := exec.Command(spec.Path, spec.Args...)
	if len(spec.JoinCgroups) > 0 || spec.NoFile > 0 {
		args := append([]string{"-c", wrapper, "dbcloud-spawn", strconv.Itoa(len(spec.JoinCgroups))}, spec.JoinCgroups...)
		args = append(args, strconv.Itoa(spec.NoFile), spec.Path)
		cmd = exec.Command("/bin/sh", append(args, spec.Args...)...)
	}
	cmd.Dir = spec.Dir
	cmd.Env = spec.Env
	if logFile != nil {
		cmd.Stdout, cmd.Stderr = logFile, logFile
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: spec.Credential}
	if spec.CgroupDir != "" {
		cg, err := os.Open(spec.CgroupDir)
		if err != nil {
			return nil, 0, fmt.Errorf("run %s: %w", spec.Path, err)
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
	}
	if err := cmd.Start(); err != nil {
		return nil, 0, fmt.Errorf("run %s: %w", spec.Path, err)
	}
	c := &Child{PID: cmd.Process.Pid, exited: make(chan struct{})}
	s.mu.Lock()
	s.children[c.PID] = c
	s.mu.Unlock()
	go func() {
		c.err = cmd.Wait()
		s.mu.Lock()
		delete(s.children, c.PID)
		s.mu.Unlock()
		close(c.exited)
	}()
	return c, logStart, nil
}

// Child returns the child with this PID, nil if pid is not one this
// supervisor started and has not yet reaped.
func (s *Supervisor) Child(pid int) *Child {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.children[pid]
}

// Live reports whether pid is a live process for which isOurs holds: not a
// zombie, not a child of ours that has exited, and (checked by isOurs, from
// /proc) running what we expect, so a PID reused by another process is not
// taken for ours.
func (s *Supervisor) Live(pid int, isOurs func(pid int) bool) bool {
	if pid <= 1 {
		return false
	}
	if c := s.Child(pid); c != nil && c.done() {
		return false
	}
	return Alive(pid) && (isOurs == nil || isOurs(pid))
}

// Wait waits up to bound for pid to exit. A child is waited for through its
// reaper; any other process counts as exited once it is gone or a zombie.
func (s *Supervisor) Wait(ctx context.Context, pid int, bound time.Duration) bool {
	c := s.Child(pid)
	timer := time.NewTimer(max(bound, 0))
	defer timer.Stop()
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	var exited <-chan struct{}
	if c != nil {
		exited = c.exited
	}
	for {
		if c == nil && !Alive(pid) {
			return true
		}
		select {
		case <-exited:
			return true
		case <-ctx.Done():
			return false
		case <-timer.C:
			return c == nil && !Alive(pid)
		case <-tick.C:
		}
	}
}

// Step is one rung of a stop ladder: a signal and how long to wait for it.
type Step struct {
	Signal syscall.Signal
	Bound  time.Duration
}

// Stop stops the processes find returns, by PID: each step's signal goes
// to whatever find still returns, and the step waits up to its bound for
// all of them to exit. It returns the signal that stopped them (0 when
// nothing ran) or an error when they survive the last step. Each signal
// is followed by SIGCONT: a process stopped (SIGSTOP: a BLUE_GREEN switch
// holding a postmaster, or its OS user) takes no other signal but SIGKILL
// until it continues, and then handles the pending one first.
func (s *Supervisor) Stop(ctx context.Context, find func() []int, steps []Step) (syscall.Signal, error) {
	for _, step := range steps {
		pids := find()
		if len(pids) == 0 {
			return 0, nil
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, step.Signal); err != nil && !errors.Is(err, syscall.ESRCH) {
				return 0, fmt.Errorf("signal %d: %w", pid, err)
			}
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		stopped := true
		for _, pid := range pids {
			if !s.Wait(ctx, pid, step.Bound) {
				stopped = false
			}
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if stopped {
			return step.Signal, nil
		}
	}
	if pids := find(); len(pids) > 0 {
		return 0, fmt.Errorf("processes %v still alive after %v", pids, steps[len(steps)-1].Signal)
	}
	return steps[len(steps)-1].Signal, nil
}

// KillAll SIGKILLs what find returns until it returns nothing, or fails at
// deadline.
func KillAll(ctx context.Context, find func() ([]int, error), deadline time.Time) error {
	for {
		pids, err := find()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still alive after SIGKILL", pids)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(PollInterval):
		}
	}
}

// State returns the state letter of /proc/PID/stat ('R', 'S', 'Z', ...)
// and the parent PID.
func State(pid int) (state byte, ppid int, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// "pid (comm) S ppid ..."; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+2:]))
	if len(fields) < 2 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	ppid, err = strconv.Atoi(fields[1])
	return fields[0][0], ppid, err
}

// UID returns the real uid of pid (the first Uid field of
// /proc/PID/status): who the process runs as.
func UID(pid int) (uint32, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				uid, err := strconv.ParseUint(f[0], 10, 32)
				return uint32(uid), err
			}
		}
	}
	return 0, fmt.Errorf("no Uid in /proc/%d/status", pid)
}

// Alive reports whether pid exists and is not a zombie.
func Alive(pid int) bool {
	state, _, err := State(pid)
	return err == nil && state != 'Z' && state != 'X'
}

// All lists the PIDs in /proc.
func All() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Find lists the live processes other than this one for which match holds.
func Find(match func(pid int) bool) []int {
	var pids []int
	for _, pid := range All() {
		if pid != os.Getpid() && match(pid) && Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Tree returns root and its descendants, found by parent PID.
func Tree(root int) []int {
	pids := []int{root}
	parents := map[int]int{}
	for _, pid := range All() {
		if _, ppid, err := State(pid); err == nil {
			parents[pid] = ppid
		}
	}
	for i := 0; i < len(pids); i++ {
		for pid, ppid := range parents {
			if ppid == pids[i] {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// Exe is the path of the program pid runs ("" if unknown).
func Exe(pid int) string {
	exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	return exe
}

// Cwd is pid's working directory ("" if unknown).
func Cwd(pid int) string {
	cwd, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
	return cwd
}

// Args is pid's command line (nil if unknown).
func Args(pid int) []string {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(raw) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
}

// ReadPID reads the PID on the first line of a pid file. Pid files live in
// the directories of the processes' OS users: read through tenantfs.
func ReadPID(path string) (int, error) {
	data, err := tenantfs.ReadFile(path)
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s: bad pid %q", path, first)
	}
	return pid, nil
}

// WriteControlFile writes one value to a kernel control file (cgroupfs,
// /proc/PID/oom_score_adj). They exist already and take one value per
// write, so no truncation or temp file.
func WriteControlFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(value); err != nil {
		f.Close()
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return f.Close()
}
