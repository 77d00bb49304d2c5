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

// exclusive wraps a provisioner and records whether two control planes
// ever worked on one resource at the same time.
type exclusive struct {
	*provisioner
	mu      sync.Mutex
	active  map[string]string // resource -> owner working on it
	overlap []string
	by      map[string]map[string]bool // resource -> owners that worked on it
}

func (x *exclusive) enter(owner, id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if other, ok := x.active[id]; ok {
		x.overlap = append(x.overlap, id+": "+other+" and "+owner)
	}
	x.active[id] = owner
	if x.by[id] == nil {
		x.by[id] = map[string]bool{}
	}
	x.by[id][owner] = true
}

func (x *exclusive) leave(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.active, id)
}

// plane is one control plane's view of the shared provisioner.
type plane struct {
	x     *exclusive
	owner string
}

func (p plane) EnsureService(ctx context.Context, s *dbcloud.Service) (*dbcloud.Observation, error) {
	p.x.enter(p.owner, s.ID)
	defer p.x.leave(s.ID)
	time.Sleep(30 * time.Millisecond) // widen the window in which overlap would show
	return p.x.provisioner.EnsureService(ctx, s)
}

func (p plane) DeleteService(ctx context.Context, s *dbcloud.Service) error {
	p.x.enter(p.owner, s.ID)
	defer p.x.leave(s.ID)
	return p.x.provisioner.DeleteService(ctx, s)
}

func (p plane) CheckService(ctx context.Context, s *dbcloud.Service, measure bool) (*dbcloud.Observation, error) {
	return p.x.provisioner.CheckService(ctx, s, measure)
}

// TestEngine_TwoControlPlanesOneStore runs two engines, each with its own
// connection pool, on one PostgreSQL store: every service is made READY, and
// no resource is ever worked on by both at once.
func TestEngine_TwoControlPlanesOneStore(t *testing.T) {
	srv := pgtest.MustStart(t)
	dsn, err := srv.CreateDatabase(t.Context(), "engine_shared")
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	x := &exclusive{provisioner: newProvisioner(), active: map[string]string{}, by: map[string]map[string]bool{}}
	var clouds []*cloud.Cloud
	for _, owner := range []string{"plane-a", "plane-b"} {
		store, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		e := engine.New(store, plane{x: x, owner: owner}, owner, logger)
		e.PollInterval, e.HealthInterval, e.LeaseTTL = 10*time.Millisecond, time.Hour, 2*time.Second
		if err := e.Open(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		c := cloud.New(store, stubRuntime{}, cloud.DefaultConfig(), logger)
		c.Notify = e.Notify
		clouds = append(clouds, c)
	}
	b, err := clouds[0].Bootstrap(t.Context(), "admin", "admin@example.com")
	if err != nil {
		t.Fatal(err)
	}
	p, err := clouds[0].Authenticate(t.Context(), b.Key.AccessKey, b.Key.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cloud.NewContextWithPrincipal(t.Context(), p)
	var ids []string
	for i := range 12 {
		v, err := clouds[i%2].CreateService(ctx, b.Project.ID, cloud.ServiceCreate{Name: "s"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.Service.ID)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for {
			v, err := clouds[0].GetService(ctx, b.Project.ID, id)
			if err == nil && v.Service.Status == dbcloud.StatusReady {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("service %s not READY: %v %v", id, v, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.overlap) > 0 {
		t.Errorf("two control planes worked on one resource at once: %v", x.overlap)
	}
	planes := map[string]bool{}
	for _, owners := range x.by {
		for o := range owners {
			planes[o] = true
		}
	}
	t.Logf("work shared by %d control planes", len(planes))
}
