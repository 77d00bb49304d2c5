package sqlstore

import (
	"context"
	"sync"
)

// writerTurn is a lock that is handed to its waiters in the order they
// came, for a database that runs one writer at a time. database/sql gives
// a freed connection to a random waiter instead, which under load kept some
// writers waiting for over a second while later ones went ahead.
type writerTurn struct {
	mu     sync.Mutex
	held   bool
	queued []chan struct{}
}

// lock waits for the turn, or until ctx is done.
func (w *writerTurn) lock(ctx context.Context) error {
	w.mu.Lock()
	if !w.held {
		w.held = true
		w.mu.Unlock()
		return nil
	}
	turn := make(chan struct{})
	w.queued = append(w.queued, turn)
	w.mu.Unlock()
	select {
	case <-turn:
		return nil
	case <-ctx.Done():
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range w.queued {
		if c == turn {
			w.queued = append(w.queued[:i], w.queued[i+1:]...)
			return ctx.Err()
		}
	}
	// The turn was handed over as ctx ended: pass it on.
	w.handOn()
	return ctx.Err()
}

// unlock hands the turn to the first waiter, if any.
func (w *writerTurn) unlock() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handOn()
}

func (w *writerTurn) handOn() {
	if len(w.queued) == 0 {
		w.held = false
		return
	}
	next := w.queued[0]
	w.queued = w.queued[1:]
	close(next)
}

// waiting reports how many wait for the turn.
func (w *writerTurn) waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queued)
}
