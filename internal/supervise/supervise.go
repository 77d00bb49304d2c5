// Package supervise runs the control plane's background goroutines so that
// a panic in one of them costs only the work it was doing. Go's runtime
// ends the whole process on a panic no goroutine recovers, and one dbcloud
// process serves every tenant's control plane: a bug reached by one
// service's reconcile, health check or backup must not take the others
// down with it.
//
// A Group runs long-lived loops (Loop) and one-shot tasks (Go), recovers a
// panic, logs it at Error with its stack and the resource it served, tells
// the owner (Task.OnPanic) so it can mark that resource's work failed, and
// restarts a loop after a short pause. Call is the same recovery for one
// item of work inside a loop: the panic comes back as an error, which the
// caller records as a failed, retryable attempt of that item.
package supervise

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
)

// A loop that panics is restarted after a pause that doubles from
// minRestartDelay to maxRestartDelay, so one that panics at once does not
// spin a core; a run that lasted longer than calmAfter starts the pause
// over, so a rare panic is not punished by an old streak.
const (
	minRestartDelay = 100 * time.Millisecond
	maxRestartDelay = 10 * time.Second
	calmAfter       = time.Minute
)

// PanicError is a recovered panic: the value passed to panic and the stack
// of the goroutine that panicked, which is where the bug is.
type PanicError struct {
	Value any
	Stack []byte
}

func (p *PanicError) Error() string { return fmt.Sprintf("panic: %v", p.Value) }

// Unwrap gives the panic's value when it is an error (a runtime error such
// as a nil dereference), so errors.As still finds it.
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}

// LogValue logs the stack with the value wherever the error is logged, so
// a caller that logs a Call's error as any other keeps the evidence.
func (p *PanicError) LogValue() slog.Value {
	return slog.GroupValue(slog.String("panic", fmt.Sprint(p.Value)), slog.String("stack", string(p.Stack)))
}

// Call runs fn and returns its error, or a *PanicError if it panicked: for
// one item of work (one reconcile of one service) that the caller then
// records as that item's failed attempt, while the other items go on.
func Call(fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn()
}

// Task describes a supervised goroutine for its log lines and its owner.
type Task struct {
	// Name says what the goroutine does ("engine health loop").
	Name string
	// Attrs name the resource it serves, as slog key-value pairs
	// ("service", id), so the panic's log line says whose work failed.
	Attrs []any
	// OnPanic, when set, is called after a panic is logged (before a
	// loop restarts): the owner marks the resource's work failed there,
	// as a retryable error, or stops work that needs the goroutine.
	OnPanic func(err *PanicError)
}

// Group runs supervised goroutines and waits for them. The zero value is
// ready to use; Logger nil logs to slog.Default().
type Group struct {
	Logger *slog.Logger
	wg     sync.WaitGroup
}

// Loop runs fn in a goroutine until it returns or ctx ends; a panic is
// recovered, logged and reported to t.OnPanic, and fn runs again after a
// pause. fn returning means the loop is done (its listener closed, its
// context ended): it is not restarted.
func (g *Group) Loop(ctx context.Context, t Task, fn func(ctx context.Context)) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		delay := minRestartDelay
		for {
			start := time.Now()
			if !g.run(t, func() { fn(ctx) }) {
				return
			}
			if time.Since(start) > calmAfter {
				delay = minRestartDelay
			}
			g.logger().Info("restarting after a panic", append([]any{"task", t.Name, "in", delay.String()}, t.Attrs...)...)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, maxRestartDelay)
		}
	}()
}

// Go runs fn once in a goroutine; a panic is recovered, logged and
// reported to t.OnPanic. For work that ends by itself (one reconcile, one
// lease's renewals), which its owner starts again if needed.
func (g *Group) Go(t Task, fn func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.run(t, fn)
	}()
}

// Wait waits for every goroutine of the group to end.
func (g *Group) Wait() { g.wg.Wait() }

// run runs fn and reports whether it panicked.
func (g *Group) run(t Task, fn func()) (panicked bool) {
	err := Call(func() error { fn(); return nil })
	p, ok := err.(*PanicError)
	if !ok {
		return false
	}
	Log(g.logger(), t.Name, p, t.Attrs...)
	if t.OnPanic != nil {
		t.OnPanic(p)
	}
	return true
}

// Log logs a recovered panic at Error with its stack and the resource
// (attrs) whose work it ended: the one line an operator needs to find the
// bug and the tenant it hit.
func Log(l *slog.Logger, task string, p *PanicError, attrs ...any) {
	l.Error("panic recovered", append([]any{"task", task, "panic", fmt.Sprint(p.Value), "stack", string(p.Stack)}, attrs...)...)
}

func (g *Group) logger() *slog.Logger {
	if g.Logger == nil {
		return slog.Default()
	}
	return g.Logger
}
