package supervise_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud/internal/supervise"
)

// logBuffer is a slog destination tests read while goroutines write.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

// waitUntil polls cond until it holds, or fails after a deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCall(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		want := errors.New("plain failure")
		if got := supervise.Call(func() error { return want }); got != want {
			t.Errorf("got %v, want %v", got, want)
		}
		if got := supervise.Call(func() error { return nil }); got != nil {
			t.Errorf("got %v, want nil", got)
		}
	})
	t.Run("ErrPanic", func(t *testing.T) {
		err := supervise.Call(func() error { panic("boom") })
		var p *supervise.PanicError
		if !errors.As(err, &p) {
			t.Fatalf("got %v (%T), want a *PanicError", err, err)
		}
		if p.Value != "boom" || err.Error() != "panic: boom" {
			t.Errorf("got value %v, message %q; want boom, %q", p.Value, err.Error(), "panic: boom")
		}
		if !strings.Contains(string(p.Stack), "supervise_test.TestCall") {
			t.Errorf("stack does not show where it panicked:\n%s", p.Stack)
		}
	})
	t.Run("ErrRuntimePanic", func(t *testing.T) {
		var m map[string]int
		err := supervise.Call(func() error { m["x"] = 1; return nil })
		var re interface{ RuntimeError() }
		if !errors.As(err, &re) {
			t.Errorf("got %v; want the runtime error reachable with errors.As", err)
		}
	})
}

func TestPanicError_LogValue(t *testing.T) {
	logger, logs := newLogger()
	err := supervise.Call(func() error { panic("boom") })
	logger.Error("reconcile", "error", err)
	if got := logs.String(); !strings.Contains(got, "error.panic=boom") || !strings.Contains(got, "error.stack=") {
		t.Errorf("log line %q; want the panic's value and stack", got)
	}
}

func TestGroup_Loop(t *testing.T) {
	t.Run("RestartsAfterPanic", func(t *testing.T) {
		logger, logs := newLogger()
		g := &supervise.Group{Logger: logger}
		ctx, cancel := context.WithCancel(t.Context())
		var runs atomic.Int32
		var reported []string
		var mu sync.Mutex
		g.Loop(ctx, supervise.Task{
			Name:  "test loop",
			Attrs: []any{"service", "svc-1"},
			OnPanic: func(err *supervise.PanicError) {
				mu.Lock()
				reported = append(reported, err.Error())
				mu.Unlock()
			},
		}, func(ctx context.Context) {
			if runs.Add(1) <= 2 {
				panic("boom")
			}
			<-ctx.Done()
		})
		waitUntil(t, "the third run", func() bool { return runs.Load() == 3 })
		cancel()
		g.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(reported) != 2 || reported[0] != "panic: boom" {
			t.Errorf("OnPanic got %q; want two panics", reported)
		}
		line := logs.String()
		for _, want := range []string{"level=ERROR", "task=\"test loop\"", "service=svc-1", "panic=boom", "stack="} {
			if !strings.Contains(line, want) {
				t.Errorf("log lacks %s:\n%s", want, line)
			}
		}
	})
	t.Run("ReturnEnds", func(t *testing.T) {
		g := &supervise.Group{Logger: slog.New(slog.DiscardHandler)}
		var runs atomic.Int32
		g.Loop(t.Context(), supervise.Task{Name: "once"}, func(context.Context) { runs.Add(1) })
		g.Wait()
		if n := runs.Load(); n != 1 {
			t.Errorf("%d runs; want 1: a loop that returns is done", n)
		}
	})
	t.Run("ContextEndsRestarts", func(t *testing.T) {
		g := &supervise.Group{Logger: slog.New(slog.DiscardHandler)}
		ctx, cancel := context.WithCancel(t.Context())
		var runs atomic.Int32
		g.Loop(ctx, supervise.Task{Name: "always panics"}, func(context.Context) {
			if runs.Add(1) == 1 {
				cancel() // ended while the loop runs: no restart after this panic
			}
			panic("boom")
		})
		g.Wait()
		if n := runs.Load(); n != 1 {
			t.Errorf("%d runs; want 1 once the context ended", n)
		}
	})
}

func TestGroup_Go(t *testing.T) {
	logger, logs := newLogger()
	g := &supervise.Group{Logger: logger}
	var got *supervise.PanicError
	g.Go(supervise.Task{Name: "worker", Attrs: []any{"resource", "r-1"}, OnPanic: func(err *supervise.PanicError) { got = err }},
		func() { panic("boom") })
	g.Wait()
	if got == nil || got.Value != "boom" {
		t.Fatalf("OnPanic got %v; want the panic", got)
	}
	if line := logs.String(); !strings.Contains(line, "resource=r-1") || strings.Contains(line, "restarting") {
		t.Errorf("log %q; want the resource and no restart", line)
	}
}
