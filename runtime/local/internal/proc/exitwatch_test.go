package proc

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// WatchExit reports the exit of a process as it happens, and nothing once
// the watch is stopped.
func TestWatchExit(t *testing.T) {
	sup := NewSupervisor()
	start := func() *Child {
		c, _, err := sup.Spawn(Spec{Path: "/bin/sleep", Args: []string{"60"}, Dir: "/"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(c.PID, syscall.SIGKILL) })
		return c
	}

	t.Run("OK", func(t *testing.T) {
		c := start()
		exited := make(chan struct{})
		stop, err := WatchExit(c.PID, func() { close(exited) })
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		syscall.Kill(c.PID, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Fatal("no exit reported within 30 s of SIGKILL")
		}
	})

	t.Run("Stopped", func(t *testing.T) {
		c := start()
		called := make(chan struct{}, 1)
		stop, err := WatchExit(c.PID, func() { called <- struct{}{} })
		if err != nil {
			t.Fatal(err)
		}
		stop()
		stop() // idempotent
		syscall.Kill(c.PID, syscall.SIGKILL)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if !sup.Wait(ctx, c.PID, 10*time.Second) {
			t.Fatal("sleep did not exit")
		}
		// A second watch of another process shows the poller would have
		// delivered by now; the stopped one stays silent.
		other := start()
		seen := make(chan struct{})
		stop2, err := WatchExit(other.PID, func() { close(seen) })
		if err != nil {
			t.Fatal(err)
		}
		defer stop2()
		syscall.Kill(other.PID, syscall.SIGKILL)
		<-seen
		select {
		case <-called:
			t.Fatal("a stopped watch reported the exit")
		default:
		}
	})

	t.Run("ErrNoProcess", func(t *testing.T) {
		if _, err := WatchExit(1<<22+1, func() {}); err == nil {
			t.Fatal("watching a PID that does not exist: no error")
		}
	})
}
