package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/engine"
)

// errProbe rolls back a lease probe: the probe only asks the store who
// could take the lease, it must not change who holds it.
var errProbe = errors.New("lease probe: roll back")

// sharedBackups is the snapshots directory every plane shares (one
// runtime directory), with no file lock of its own: it takes a snapshot
// whenever one is due, whoever asks, so only the store's lease keeps two
// planes from both taking one. It records every call made without the
// calling plane holding the service's lease in the store.
type sharedBackups struct {
	*provisioner
	store dbcloud.Store
	every time.Duration // a snapshot is due when the newest is older

	mu        sync.Mutex
	stopped   bool // no more snapshots are due: the test counts them
	snaps     map[string][]dbcloud.SnapshotInfo
	byPlane   map[string]int
	violation []string
}

// backupPlane is one control plane's handle on the shared backups.
type backupPlane struct {
	*sharedBackups
	owner string
}

func (p backupPlane) MaintainBackups(ctx context.Context, svc *dbcloud.Service) error {
	// A call the engine cancelled (it is closing) proves nothing either way.
	if err := p.holdsLease(ctx, svc.ID); err != nil && ctx.Err() == nil {
		p.mu.Lock()
		p.violation = append(p.violation, err.Error())
		p.mu.Unlock()
	}
	p.mu.Lock()
	snaps := p.snaps[svc.ID]
	due := !p.stopped && (len(snaps) == 0 || time.Since(snaps[len(snaps)-1].Finished) >= p.every)
	p.mu.Unlock()
	if !due {
		return nil
	}
	started := time.Now().UTC()
	// A snapshot takes a while: widen the window in which a second plane
	// working without the lease would take one too.
	select {
	case <-time.After(30 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.snaps[svc.ID])
	p.snaps[svc.ID] = append(p.snaps[svc.ID], dbcloud.SnapshotInfo{
		Name: fmt.Sprintf("%s-%d", svc.ID, n), Started: started, Finished: time.Now().UTC()})
	p.byPlane[p.owner]++
	return nil
}

func (p backupPlane) Snapshots(ctx context.Context, svc *dbcloud.Service) ([]dbcloud.SnapshotInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]dbcloud.SnapshotInfo(nil), p.snaps[svc.ID]...), nil
}

// holdsLease asks the store, at the moment of the call, whether p.owner
// holds the service's lease: a stranger must not be able to take it (so
// someone holds it), and p.owner must (so that someone is p.owner). Both
// probes are rolled back.
func (p backupPlane) holdsLease(ctx context.Context, id string) error {
	probe := func(owner string) (bool, error) {
		var ok bool
		now := time.Now().UTC()
		err := p.store.Update(ctx, func(tx dbcloud.Tx) (err error) {
			if ok, err = tx.AcquireLease(id, owner, now, now.Add(time.Second)); err != nil {
				return err
			}
			return errProbe
		})
		if !errors.Is(err, errProbe) {
			return false, err
		}
		return ok, nil
	}
	free, err := probe("lease-probe")
	if err != nil {
		return fmt.Errorf("%s: probe the lease of %s: %w", p.owner, id, err)
	}
	if free {
		return fmt.Errorf("%s maintained the backups of %s while no plane held its lease", p.owner, id)
	}
	mine, err := probe(p.owner)
	if err != nil {
		return fmt.Errorf("%s: probe the lease of %s: %w", p.owner, id, err)
	}
	if !mine {
		return fmt.Errorf("%s maintained the backups of %s while another plane held its lease", p.owner, id)
	}
	return nil
}

// TestEngine_BackupsUnderLeaseTwoPlanes: two planes on one store offer
// the same services' backups to runtimes that share one snapshots
// directory without a file lock. Every MaintainBackups call is made by the
// plane holding the service's lease in the store at that moment, and each
// snapshot is reported by exactly one snapshot.completed event.
func TestEngine_BackupsUnderLeaseTwoPlanes(t *testing.T) {
	s := newSharedStore(t, "engine_backup_lease")
	b := &sharedBackups{provisioner: newProvisioner(), store: s.store, every: 150 * time.Millisecond,
		snaps: map[string][]dbcloud.SnapshotInfo{}, byPlane: map[string]int{}}
	var planes []*engine.Engine
	for _, owner := range []string{"plane-a", "plane-b"} {
		e := engine.New(openShared(t, s.dsn), backupPlane{sharedBackups: b, owner: owner}, owner,
			slog.New(slog.NewTextHandler(io.Discard, nil)))
		e.PollInterval, e.HealthInterval, e.BackupInterval, e.LeaseTTL = 10*time.Millisecond, time.Hour, 10*time.Millisecond, 2*time.Second
		if err := e.Open(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		planes = append(planes, e)
	}
	var ids []string
	for range 3 {
		v, err := s.cloud.CreateService(s.ctx, s.pid, cloud.ServiceCreate{Name: "s"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.Service.ID)
	}
	s.waitReady(t, ids, 30*time.Second)
	const want = 4
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b.mu.Lock()
		short := ""
		for _, id := range ids {
			if len(b.snaps[id]) < want {
				short = fmt.Sprintf("service %s has %d snapshots, want %d", id, len(b.snaps[id]), want)
			}
		}
		b.stopped = short == ""
		b.mu.Unlock()
		if short == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(short)
		}
	}
	// No snapshot is taken any more; once every one taken is reported, the
	// planes are stopped (a round they cancel would report nothing), and
	// the events are final.
	waitReported(t, s, b)
	for _, e := range planes {
		e.Close()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.violation); n > 0 {
		t.Errorf("%d MaintainBackups calls without the calling plane holding the lease, the first: %q", n, b.violation[:min(n, 3)])
	}
	reported := countReported(t, s)
	for _, id := range ids {
		for _, snap := range b.snaps[id] {
			if n := reported[snap.Name]; n != 1 {
				t.Errorf("snapshot %s reported by %d snapshot.completed events, want 1", snap.Name, n)
			}
			delete(reported, snap.Name)
		}
	}
	for name, n := range reported {
		t.Errorf("%d snapshot.completed events for %s, which no plane took", n, name)
	}
	t.Logf("snapshots taken per plane: %v", b.byPlane)
}

// waitReported waits until every snapshot taken has a snapshot.completed
// event.
func waitReported(t *testing.T, s *sharedStore, b *sharedBackups) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		reported := countReported(t, s)
		missing := ""
		b.mu.Lock()
		for _, snaps := range b.snaps {
			for _, snap := range snaps {
				if reported[snap.Name] == 0 {
					missing = snap.Name
				}
			}
		}
		b.mu.Unlock()
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot %s has no snapshot.completed event", missing)
		}
	}
}

// countReported counts the snapshot.completed events per snapshot name.
func countReported(t *testing.T, s *sharedStore) map[string]int {
	t.Helper()
	events, err := listAllEvents(t.Context(), s.store, s.pid)
	if err != nil {
		t.Fatal(err)
	}
	reported := map[string]int{}
	for _, ev := range events {
		if ev.Type == dbcloud.EventSnapshotTaken {
			reported[ev.Snapshot.Name]++
		}
	}
	return reported
}

// listAllEvents reads every event of the project, page by page.
func listAllEvents(ctx context.Context, store dbcloud.Store, projectID string) ([]*dbcloud.Event, error) {
	var all []*dbcloud.Event
	for after := int64(0); ; {
		var page []*dbcloud.Event
		err := store.View(ctx, func(tx dbcloud.Tx) (err error) {
			page, err = tx.ListEvents(projectID, after, 100)
			return err
		})
		if err != nil || len(page) == 0 {
			return all, err
		}
		all = append(all, page...)
		after = page[len(page)-1].ID
	}
}
