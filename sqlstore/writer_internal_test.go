package sqlstore

import (
	"context"
	"testing"
	"time"
)

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// TestWriterTurn_ArrivalOrder: writers get the turn in the order they
// asked for it, and one that gives up while queued leaves the others
// their turns.
func TestWriterTurn_ArrivalOrder(t *testing.T) {
	var w writerTurn
	if err := w.lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	const n = 20
	order := make(chan int, n)
	gaveUp, cancel := context.WithCancel(t.Context())
	quit := make(chan error, 1)
	queued := 0
	queue := func(lock func()) {
		go lock()
		queued++
		waitFor(t, "the writer to queue", func() bool { return w.waiting() == queued })
	}
	for i := range n {
		queue(func() {
			if err := w.lock(t.Context()); err != nil {
				t.Error(err)
				return
			}
			order <- i
			w.unlock()
		})
		if i == n/2 {
			queue(func() { quit <- w.lock(gaveUp) })
		}
	}
	cancel()
	if err := <-quit; err == nil {
		t.Fatal("a writer whose context ended got the turn")
	}
	w.unlock()
	for want := range n {
		if got := <-order; got != want {
			t.Fatalf("writer %d had the turn in place %d; want arrival order", got, want)
		}
	}
}
