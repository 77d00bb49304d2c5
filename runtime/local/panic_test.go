package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"dbcloud/internal/flock"
	"dbcloud/internal/supervise"
	"dbcloud/runtime/local/internal/localtest"
)

// TestRuntime_PanicIssuingCertificate: a panic in the goroutine that
// issues a service's certificate during an ensure is that ensure's error,
// which the engine records as the service's failed attempt; the engine's
// own recovery does not see that goroutine, so without this the process
// would end.
func TestRuntime_PanicIssuingCertificate(t *testing.T) {
	rt := mustRuntime(t, localtest.Base(t))
	rt.cfg.CA = nil // a bug in issuing: a nil CA dereferenced
	svc := newTestService(t, rt, "certpanic", "pw", nil)
	_, err := rt.EnsureService(t.Context(), svc)
	var p *supervise.PanicError
	if !errors.As(err, &p) {
		t.Fatalf("ensure: %v; want the issuing goroutine's panic as its error", err)
	}
}

// TestRuntime_LogRetentionRoundUnlocksOnPanic: a round of log retention
// that panics releases the retention lock, so the loop restarted by its
// supervisor (and any other plane) takes it again; a lock left held would
// end log retention on the host for good.
func TestRuntime_LogRetentionRoundUnlocksOnPanic(t *testing.T) {
	rt := mustRuntime(t, localtest.Base(t))
	if err := os.MkdirAll(filepath.Join(rt.cfg.DataDir, "services", "svc"), 0o755); err != nil {
		t.Fatal(err)
	}
	var noCtx context.Context // a bug: the round's context is nil, read once a service is seen
	err := supervise.Call(func() error { rt.logRetentionRound(noCtx, DefaultLogRetention()); return nil })
	var p *supervise.PanicError
	if !errors.As(err, &p) {
		t.Fatalf("round: %v; want its panic", err)
	}
	lock, ok, err := flock.TryLock(filepath.Join(rt.cfg.DataDir, logRetentionLock))
	if err != nil || !ok {
		t.Fatalf("retention lock after the panic: taken %v, %v; want it free", ok, err)
	}
	lock.Unlock()
}
