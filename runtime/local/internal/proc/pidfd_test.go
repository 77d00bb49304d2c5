package proc

import (
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A pidfd signals its process, reports its exit while it is a zombie (its
// parent not waiting yet), and once the process is reaped a signal through
// it reaches no one, whatever process took the PID since.
func TestPidfd(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	p, err := OpenPidfd(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Exited() {
		t.Fatal("a running process reported exited")
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !p.Exited() {
		if time.Now().After(deadline) {
			t.Fatal("no exit seen within 30 s of SIGTERM")
		}
		time.Sleep(PollInterval)
	}
	if state, _, err := State(cmd.Process.Pid); err != nil || state != 'Z' {
		t.Errorf("state when the exit was seen: %c %v, want a zombie (not reaped yet)", state, err)
	}
	cmd.Wait()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("a signal to the reaped process: %v, want nothing done", err)
	}
	if _, err := OpenPidfd(cmd.Process.Pid); err == nil {
		t.Log("the PID was taken again already")
	} else if !errors.Is(err, syscall.ESRCH) {
		t.Errorf("pidfd_open of a reaped PID: %v, want ESRCH", err)
	}
}
