package proc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A dead process that its parent has not reaped is a zombie: it still has
// a /proc entry and kill(pid, 0) succeeds, but it must count as dead.
func TestAlive_Zombie(t *testing.T) {
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	pid := cmd.Process.Pid
	deadline := time.Now().Add(30 * time.Second)
	for {
		state, _, err := State(pid)
		if err != nil {
			t.Fatal(err)
		}
		if state == 'Z' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d never became a zombie (state %c)", pid, state)
		}
		time.Sleep(time.Millisecond)
	}
	if Alive(pid) {
		t.Errorf("zombie %d reported alive", pid)
	}
	if !Alive(os.Getpid()) {
		t.Error("this process reported dead")
	}
}

// Spawn runs the program in a session of its own with its output in the
// log and the open-file limit raised; Stop climbs the ladder until the
// process exits, and the reaper makes it dead at once (no zombie).
func TestSupervisor_SpawnStop(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "out.log")
	s := NewSupervisor()
	// The shell ignores SIGTERM, so only the second rung stops it.
	c, _, err := s.Spawn(Spec{
		Path: "/bin/sh", Args: []string{"-c", `trap "" TERM; echo "nofile $(ulimit -n)"; while :; do sleep 0.05; done`},
		Dir: dir, Env: []string{"PATH=/usr/bin:/bin"}, LogPath: log, NoFile: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if data, _ := os.ReadFile(log); strings.Contains(string(data), "nofile 1000") {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("log %q: want the raised limit, nofile 1000", data)
		}
	}
	if sid, err := unix.Getsid(c.PID); err != nil || sid != c.PID {
		t.Errorf("session of %d = %d (%v), want its own", c.PID, sid, err)
	}
	if !s.Live(c.PID, nil) {
		t.Fatal("spawned child not live")
	}
	find := func() []int {
		if s.Live(c.PID, nil) {
			return []int{c.PID}
		}
		return nil
	}
	sig, err := s.Stop(context.Background(), find, []Step{{syscall.SIGTERM, 200 * time.Millisecond}, {syscall.SIGKILL, 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if sig != syscall.SIGKILL {
		t.Errorf("stopped by %v, want SIGKILL (SIGTERM is ignored)", sig)
	}
	if s.Live(c.PID, nil) || s.Child(c.PID) != nil {
		t.Error("stopped child still live or not reaped")
	}
	if sig, err := s.Stop(context.Background(), find, []Step{{syscall.SIGTERM, time.Second}}); err != nil || sig != 0 {
		t.Errorf("stop of nothing: %v, %v; want 0, nil", sig, err)
	}
}

func TestReadPID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.pid")
	for content, want := range map[string]int{"42\n": 42, "7\n/data\n123\n": 7, "x\n": 0, "": 0, "-3": 0} {
		os.WriteFile(path, []byte(content), 0o600)
		got, err := ReadPID(path)
		if got != want || (want == 0) != (err != nil) {
			t.Errorf("ReadPID(%q) = %d, %v; want %d", content, got, err, want)
		}
	}
}

// TestLogTail_OnlyRegularFiles: a symlink or a FIFO where a process log
// should be yields nothing, at once.
func TestLogTail_OnlyRegularFiles(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("secret contents\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	regular := filepath.Join(dir, "regular.log")
	if err := os.WriteFile(regular, []byte("could not bind\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.log")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.log")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := LogTail(regular, 0); !strings.Contains(got, "could not bind") {
		t.Errorf("regular log: got %q", got)
	}
	if got := LogTail(link, 0); got != "" {
		t.Errorf("symlinked log followed: %q", got)
	}
	done := make(chan string, 1)
	go func() { done <- LogTail(fifo, 0) }()
	select {
	case got := <-done:
		if got != "" {
			t.Errorf("FIFO log: got %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LogTail still blocked on a FIFO after 10 s")
	}
}

// A stopped process (SIGSTOP) is stopped by the ladder's first rung it
// heeds, not left for SIGKILL: the signal is followed by SIGCONT.
func TestSupervisor_StopStopped(t *testing.T) {
	s := NewSupervisor()
	c, _, err := s.Spawn(Spec{
		Path: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; while :; do sleep 0.05; done`},
		Dir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}, LogPath: filepath.Join(t.TempDir(), "out.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(c.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		if state, _, err := State(c.PID); err == nil && state == 'T' {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("child %d not stopped (state %c, %v)", c.PID, state, err)
		}
	}
	find := func() []int {
		if s.Live(c.PID, nil) {
			return []int{c.PID}
		}
		return nil
	}
	sig, err := s.Stop(context.Background(), find, []Step{{syscall.SIGTERM, 30 * time.Second}, {syscall.SIGKILL, 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if sig != syscall.SIGTERM {
		t.Errorf("a stopped process was stopped by %v, want SIGTERM (which it heeds once continued)", sig)
	}
}
