package local

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"dbcloud/runtime/local/internal/localtest"
)

// TestRuntime_HAWatchesPrimaryExit: the exit of an HA primary's postmaster
// is reported as it happens (the engine checks the service at once), the
// check names that exit as the cause, and the repair fails over without
// the grace a primary merely seen down at a check gets (its log says so).
// A primary the runtime stops on purpose is not watched: its exit is no
// failure.
func TestRuntime_HAWatchesPrimaryExit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several PostgreSQL instances")
	}
	rt := mustRuntime(t, localtest.Base(t))
	logs := &logRecorder{next: rt.cfg.Logger.Handler()}
	rt.cfg.Logger = slog.New(logs)
	noticed := make(chan [2]string, 4)
	rt.WatchFailures(func(projectID, serviceID string) { noticed <- [2]string{projectID, serviceID} })
	svc := haTestService(t, rt, "hawatch", "ha-watch-secret", 1, 1)
	ctx := context.Background()
	st, _ := rt.loadHA(svc.ID)
	base, _ := rt.preparedBase(ctx, svc)
	old := rt.haSpec(svc, base, st, st.Primary)

	killInstance(t, rt, old)
	select {
	case got := <-noticed:
		if got != [2]string{svc.ProjectID, svc.ID} {
			t.Fatalf("noticed %v, want [%s %s]", got, svc.ProjectID, svc.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the primary's exit was not reported within 30 s")
	}
	obs, err := rt.checkHA(ctx, svc, false)
	if err != nil {
		t.Fatal(err)
	}
	if obs.Running || !strings.Contains(obs.Reason, "exited") {
		t.Errorf("check after the exit: running %v, reason %q; want the exit named", obs.Running, obs.Reason)
	}
	if _, err := rt.ensureHA(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if st2, _ := rt.loadHA(svc.ID); st2.Primary == st.Primary {
		t.Fatalf("primary still instance %d", st.Primary)
	}
	if !logs.Has("primary down; failing over", "cause", "postmaster exited") {
		t.Errorf("no failover with cause %q logged:\n%s", "postmaster exited", logs)
	}
	if !rt.watched(svc.ID) {
		t.Error("the new primary is not watched")
	}

	svc.Spec.Running = false
	mustEnsure(t, rt, svc)
	if rt.watched(svc.ID) {
		t.Error("a primary stopped on purpose is still watched")
	}
	select {
	case got := <-noticed:
		t.Errorf("the stop on purpose was reported as a failure of %v", got)
	default:
	}
}

// watched reports whether the service's primary is watched.
func (rt *Runtime) watched(serviceID string) bool {
	rt.watches.mu.Lock()
	defer rt.watches.mu.Unlock()
	_, ok := rt.watches.watching[serviceID]
	return ok
}

// logRecorder keeps the runtime's log records (and passes them on), so a
// test can ask what the runtime said it did.
type logRecorder struct {
	next    slog.Handler
	mu      sync.Mutex
	records []string // "msg key=value ..."
}

func (r *logRecorder) Enabled(ctx context.Context, l slog.Level) bool { return true }
func (r *logRecorder) WithAttrs(as []slog.Attr) slog.Handler          { return r }
func (r *logRecorder) WithGroup(string) slog.Handler                  { return r }

func (r *logRecorder) Handle(ctx context.Context, rec slog.Record) error {
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		line += fmt.Sprintf(" %s=%v", a.Key, a.Value)
		return true
	})
	r.mu.Lock()
	r.records = append(r.records, line)
	r.mu.Unlock()
	if r.next.Enabled(ctx, rec.Level) {
		return r.next.Handle(ctx, rec)
	}
	return nil
}

// Has reports whether a record with this message had key=value.
func (r *logRecorder) Has(msg, key, value string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.records {
		if strings.HasPrefix(l, msg+" ") && strings.Contains(l, " "+key+"="+value) {
			return true
		}
	}
	return false
}

func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.records, "\n")
}
