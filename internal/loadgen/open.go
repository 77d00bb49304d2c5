package loadgen

import (
	"context"
	"sync"
	"time"
)

// An open loop offers a fixed rate of requests whatever the server does:
// request i is due at start + i/rate, and it is sent then even if earlier
// ones have not been answered. Its latency is measured from when it was
// due, not from when it was sent, so a server that stalls is charged for
// every request that waited on the stall (a closed loop sends fewer
// requests while it stalls and so hides most of it: coordinated omission).

// scheduledKey carries a request's due time in its context.
type scheduledKey struct{}

// WithScheduled returns ctx carrying the time its request was due, which
// Do measures latency from.
func WithScheduled(ctx context.Context, at time.Time) context.Context {
	return context.WithValue(ctx, scheduledKey{}, at)
}

// Scheduled returns the time ctx's request was due, if an open loop
// scheduled it.
func Scheduled(ctx context.Context) (time.Time, bool) {
	at, ok := ctx.Value(scheduledKey{}).(time.Time)
	return at, ok
}

// OpenResult is what an open loop did.
type OpenResult struct {
	// Elapsed is from the first due time to the last answer.
	Elapsed time.Duration
	// Issued is how many requests were due, all of which were sent.
	Issued int
	// MaxSendLag is the longest a request was sent after it was due: the
	// generator's own delay (it is inside every latency measured, so a
	// large one says the generator, not the server, was short of CPU).
	MaxSendLag time.Duration
}

// RunOpen calls send(ctx, i) for request i = 0, 1, ... at rate per second
// for duration, each in a goroutine of its own, and waits for every call
// to return. ctx carries the request's due time (Scheduled), which Do
// measures latency from. At most maxInFlight calls run at once (0: no
// bound); a request that waits for a place is late, and that wait counts
// in its latency as any other.
func RunOpen(ctx context.Context, rate float64, duration time.Duration, maxInFlight int, send func(ctx context.Context, i int)) OpenResult {
	interval := time.Duration(float64(time.Second) / rate)
	n := int(duration / interval)
	var sem chan struct{}
	if maxInFlight > 0 {
		sem = make(chan struct{}, maxInFlight)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		maxLag time.Duration
	)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			n = i
			break
		}
		wg.Go(func() {
			if sem != nil {
				sem <- struct{}{}
				defer func() { <-sem }()
			}
			if lag := time.Since(due); lag > 0 {
				mu.Lock()
				maxLag = max(maxLag, lag)
				mu.Unlock()
			}
			send(WithScheduled(ctx, due), i)
		})
	}
	wg.Wait()
	return OpenResult{Elapsed: time.Since(start), Issued: n, MaxSendLag: maxLag}
}
