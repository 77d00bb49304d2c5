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
	"dbcloud/internal/pgtest"
	"dbcloud/postgres"
)

// sharedStore is one PostgreSQL store that several planes open, each with
// its own connection pool, and the domain's view of it.
type sharedStore struct {
	dsn   string
	store dbcloud.Store
	cloud *cloud.Cloud
	ctx   context.Context // carries the principal
	pid   string
}

func newSharedStore(t *testing.T, name string) *sharedStore {
	t.Helper()
	srv := pgtest.MustStart(t)
	dsn, err := srv.CreateDatabase(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	s := &sharedStore{dsn: dsn, store: openShared(t, dsn)}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	s.cloud = cloud.New(s.store, stubRuntime{}, cloud.DefaultConfig(), logger)
	b, err := s.cloud.Bootstrap(t.Context(), "admin", "admin@example.com")
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.cloud.Authenticate(t.Context(), b.Key.AccessKey, b.Key.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	s.ctx, s.pid = cloud.NewContextWithPrincipal(t.Context(), p), b.Project.ID
	return s
}

func openShared(t *testing.T, dsn string) dbcloud.Store {
	t.Helper()
	store, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// plane starts an engine with its own store connection and a short lease.
func (s *sharedStore) plane(t *testing.T, p dbcloud.Provisioner, owner string, ttl time.Duration) *engine.Engine {
	t.Helper()
	e := engine.New(openShared(t, s.dsn), p, owner, slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval, e.LeaseTTL = 10*time.Millisecond, time.Hour, ttl
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func (s *sharedStore) waitReady(t *testing.T, ids []string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, id := range ids {
		for {
			v, err := s.cloud.GetService(s.ctx, s.pid, id)
			if err == nil && v.Service.Status == dbcloud.StatusReady {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("service %s not READY within %v: %v %v", id, within, v, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// firstEnsure records when each resource was first worked on.
type firstEnsure struct {
	*provisioner
	mu    sync.Mutex
	first map[string]time.Time
}

func (f *firstEnsure) EnsureService(ctx context.Context, s *dbcloud.Service) (*dbcloud.Observation, error) {
	f.mu.Lock()
	if _, ok := f.first[s.ID]; !ok {
		f.first[s.ID] = time.Now()
	}
	f.mu.Unlock()
	return f.provisioner.EnsureService(ctx, s)
}

// TestEngine_TakeoverAfterShortLease: a plane died holding a service's
// lease (it stopped renewing). Another plane with a short TTL takes the
// service over once the lease has expired, and not a moment before.
func TestEngine_TakeoverAfterShortLease(t *testing.T) {
	s := newSharedStore(t, "engine_takeover")
	v, err := s.cloud.CreateService(s.ctx, s.pid, cloud.ServiceCreate{Name: "orphaned"})
	if err != nil {
		t.Fatal(err)
	}
	id := v.Service.ID
	// The dead plane's last renewal: its lease runs out at expires.
	now := time.Now().UTC()
	expires := now.Add(1500 * time.Millisecond)
	if err := s.store.Update(t.Context(), func(tx dbcloud.Tx) error {
		ok, err := tx.AcquireLease(id, "dead-plane", now, expires)
		if err == nil && !ok {
			t.Fatal("the dead plane did not get the lease")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	p := &firstEnsure{provisioner: newProvisioner(), first: map[string]time.Time{}}
	s.plane(t, p, "plane-b", 600*time.Millisecond)
	s.waitReady(t, []string{id}, 30*time.Second)
	p.mu.Lock()
	defer p.mu.Unlock()
	if got := p.first[id]; got.Before(expires) {
		t.Errorf("plane-b worked on the service at %v, before the dead plane's lease expired at %v", got, expires)
	}
}

// slowPlane is a plane whose every ensure lasts several lease TTLs: only
// renewal keeps the lease.
type slowPlane struct {
	plane
	work time.Duration
}

func (p slowPlane) EnsureService(ctx context.Context, s *dbcloud.Service) (*dbcloud.Observation, error) {
	p.x.enter(p.owner, s.ID)
	defer p.x.leave(s.ID)
	select {
	case <-time.After(p.work):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return p.x.provisioner.EnsureService(ctx, s)
}

// TestEngine_ShortLeaseRenewedDuringLongWork: with a lease TTL far shorter
// than the work, two planes still never work on one service at once, and
// every service gets READY: renewal, not the TTL, keeps a lease held.
func TestEngine_ShortLeaseRenewedDuringLongWork(t *testing.T) {
	s := newSharedStore(t, "engine_short_lease")
	x := &exclusive{provisioner: newProvisioner(), active: map[string]string{}, by: map[string]map[string]bool{}}
	for _, owner := range []string{"plane-a", "plane-b"} {
		// The work lasts three TTLs. The TTL is not shorter still: a
		// renewal is one store write every third of it, and on a loaded
		// 2-core machine (CI runs the e2e suite beside this package) a
		// 300 ms TTL's 100 ms ticks were late enough for the lease to
		// expire before the renewal's own check, and the other plane took
		// it over while this one still worked.
		s.plane(t, slowPlane{plane: plane{x: x, owner: owner}, work: 3 * time.Second}, owner, time.Second)
	}
	var ids []string
	for range 4 {
		v, err := s.cloud.CreateService(s.ctx, s.pid, cloud.ServiceCreate{Name: "s"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.Service.ID)
	}
	s.waitReady(t, ids, 60*time.Second)
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.overlap) > 0 {
		t.Errorf("two control planes worked on one resource at once: %v", x.overlap)
	}
}
