package engine_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/engine"
)

// quietBackups is a provisioner whose backups tell when work is due.
type quietBackups struct {
	*provisioner
	mu         sync.Mutex
	quiet      map[string]bool
	maintained map[string]int
	panics     map[string]bool // services whose MaintainBackups panics
}

func (q *quietBackups) BackupsDue(svc *dbcloud.Service) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.quiet[svc.ID]
}

func (q *quietBackups) MaintainBackups(ctx context.Context, svc *dbcloud.Service) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.maintained[svc.ID]++
	if q.panics[svc.ID] {
		var m map[string]int
		m[svc.ID]++ // a nil map written
	}
	return nil
}

// TestEngine_BackupLoopSkipsServicesWithNothingDue: a service whose
// backups say nothing is due is not maintained (no lease taken for it),
// while another is, every round.
func TestEngine_BackupLoopSkipsServicesWithNothingDue(t *testing.T) {
	f := newFixture(t)
	q := &quietBackups{provisioner: f.prov, quiet: map[string]bool{}, maintained: map[string]int{}}
	var ids []string
	for _, name := range []string{"quiet", "due"} {
		v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.Service.ID)
	}
	q.quiet[ids[0]] = true
	e := engine.New(f.store, q, "a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval, e.BackupInterval = 20*time.Millisecond, time.Hour, 20*time.Millisecond
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	f.cloud.Notify = e.Notify
	for _, id := range ids {
		f.waitStatus(t, id, dbcloud.StatusReady)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		q.mu.Lock()
		n := q.maintained[ids[1]]
		q.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service with backup work due was maintained %d times, want 3", n)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := q.maintained[ids[0]]; n != 0 {
		t.Errorf("the service with nothing due was maintained %d times", n)
	}
}
