package local

import (
	"context"
	"sync"
	"time"
)

// steps times the steps of one ensure, for the one log line that says
// where a create's time went (a create is measured against its floor:
// bench/issue19-create.md). It travels in the context so that the helpers
// an ensure shares with other paths need no extra parameter.
type steps struct {
	mu    sync.Mutex
	begin time.Time
	last  time.Time
	attrs []any
}

type stepsKey struct{}

// withSteps starts timing the steps of an ensure.
func withSteps(ctx context.Context) (context.Context, *steps) {
	now := time.Now()
	s := &steps{begin: now, last: now}
	return context.WithValue(ctx, stepsKey{}, s), s
}

// stepDone records that the named step ended now; without a timer in ctx
// it does nothing.
func stepDone(ctx context.Context, name string) {
	s, ok := ctx.Value(stepsKey{}).(*steps)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.attrs = append(s.attrs, name+"_ms", float64(now.Sub(s.last).Microseconds())/1000)
	s.last = now
}

// logAttrs are the steps' durations and the total, as slog attributes.
func (s *steps) logAttrs() []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(append([]any{}, s.attrs...), "total_ms", float64(time.Since(s.begin).Microseconds())/1000)
}
