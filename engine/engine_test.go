package engine_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/engine"
	"dbcloud/sqlite"
)

// provisioner is a stand-in runtime for engine unit tests: it remembers
// what it was asked and can fail or block on demand.
type provisioner struct {
	mu      sync.Mutex
	running map[string]bool
	sizes   map[string]dbcloud.Size
	ensures map[string]int
	deleted map[string]bool
	fail    map[string][]error // errors to return from the next EnsureService calls
	panics  map[string]int     // how many of the next EnsureService calls panic
	// checkPanics makes every CheckService of these services panic;
	// checks counts the calls.
	checkPanics map[string]bool
	checks      map[string]int
	block       chan struct{}            // when set, EnsureService waits for it
	blockOf     map[string]chan struct{} // the same for one service
	held        map[string]int           // EnsureService calls that waited on blockOf
	cancelled   int                      // EnsureService calls whose context ended while they waited
	// failSize, when set, fails every EnsureService of a service of that
	// size, as PostgreSQL does with a size the host cannot map.
	failSize *dbcloud.Size
	last     map[string]dbcloud.Service // what the last EnsureService of each service was given
}

func newProvisioner() *provisioner {
	return &provisioner{running: map[string]bool{}, sizes: map[string]dbcloud.Size{}, ensures: map[string]int{},
		deleted: map[string]bool{}, fail: map[string][]error{}, panics: map[string]int{},
		checkPanics: map[string]bool{}, checks: map[string]int{}, last: map[string]dbcloud.Service{},
		blockOf: map[string]chan struct{}{}, held: map[string]int{}}
}

func (p *provisioner) EnsureService(ctx context.Context, s *dbcloud.Service) (*dbcloud.Observation, error) {
	p.mu.Lock()
	block := p.block
	if b := p.blockOf[s.ID]; b != nil {
		block = b
		p.held[s.ID]++
	}
	p.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			p.mu.Lock()
			p.cancelled++
			p.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ensures[s.ID]++
	p.last[s.ID] = *s
	if p.panics[s.ID] > 0 {
		p.panics[s.ID]--
		var m map[string]int
		m[s.ID]++ // a bug in a runtime: a nil map written
	}
	if errs := p.fail[s.ID]; len(errs) > 0 {
		p.fail[s.ID] = errs[1:]
		return nil, errs[0]
	}
	if p.failSize != nil && s.Spec.Size == *p.failSize {
		return nil, errors.New("could not map anonymous shared memory")
	}
	p.running[s.ID] = s.Spec.Running
	p.sizes[s.ID] = s.Spec.Size
	return &dbcloud.Observation{Running: s.Spec.Running, Instances: []dbcloud.Instance{{ID: s.ID + "-0", Role: "primary"}}}, nil
}

func (p *provisioner) count(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ensures[id]
}

func (p *provisioner) wasDeleted(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deleted[id]
}

func (p *provisioner) DeleteService(ctx context.Context, s *dbcloud.Service) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deleted[s.ID] = true
	delete(p.running, s.ID)
	return nil
}

func (p *provisioner) CheckService(ctx context.Context, s *dbcloud.Service, measure bool) (*dbcloud.Observation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checks[s.ID]++
	if p.checkPanics[s.ID] {
		var obs *dbcloud.Observation
		_ = obs.Running // a bug in a runtime: a nil pointer read
	}
	return &dbcloud.Observation{Running: p.running[s.ID], Metrics: &dbcloud.Metrics{MemoryMB: 18, StorageMB: 40}}, nil
}

// stubRuntime answers the request-time questions of the domain.
type stubRuntime struct{}

func (stubRuntime) PGVersions() []dbcloud.PGVersion {
	return []dbcloud.PGVersion{{Major: 15, Full: "15.20"}}
}
func (stubRuntime) PortFree(int) bool { return true }
func (stubRuntime) SetPassword(context.Context, *dbcloud.Service, string) error {
	return nil
}
func (stubRuntime) Logs(context.Context, *dbcloud.Service, dbcloud.LogQuery) (*dbcloud.LogPage, error) {
	return &dbcloud.LogPage{}, nil
}

type fixture struct {
	store dbcloud.Store
	cloud *cloud.Cloud
	prov  *provisioner
	ctx   context.Context // carries the principal
	pid   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	c := cloud.New(s, stubRuntime{}, cloud.DefaultConfig(), logger)
	b, err := c.Bootstrap(t.Context(), "admin", "admin@example.com")
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Authenticate(t.Context(), b.Key.AccessKey, b.Key.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{store: s, cloud: c, prov: newProvisioner(), ctx: cloud.NewContextWithPrincipal(t.Context(), p), pid: b.Project.ID}
}

func (f *fixture) engine(t *testing.T, owner string) *engine.Engine {
	t.Helper()
	return f.engineWith(t, owner)
}

// engineWith is engine with what a test sets before it starts (its
// logger, its network).
func (f *fixture) engineWith(t *testing.T, owner string, set ...func(e *engine.Engine)) *engine.Engine {
	t.Helper()
	e := engine.New(f.store, f.prov, owner, slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.PollInterval, e.HealthInterval, e.MetricsInterval = 20*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond
	e.LeaseTTL = 1500 * time.Millisecond
	e.MaxAttempts = 3
	for _, fn := range set {
		fn(e)
	}
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	f.cloud.Notify = e.Notify
	t.Cleanup(func() { e.Close() })
	return e
}

// waitFor polls the service until cond holds, or fails after a deadline.
func (f *fixture) waitFor(t *testing.T, id string, what string, cond func(s *cloud.ServiceView, err error) bool) *cloud.ServiceView {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := f.cloud.GetService(f.ctx, f.pid, id)
		if cond(v, err) {
			return v
		}
		if time.Now().After(deadline) {
			st := "gone"
			if v != nil {
				st = string(v.Service.Status) + " " + v.Service.StatusReason
			}
			t.Fatalf("service %s: %s not reached; now %s (err %v)", id, what, st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *fixture) waitStatus(t *testing.T, id string, want dbcloud.ServiceStatus) *cloud.ServiceView {
	t.Helper()
	return f.waitFor(t, id, string(want), func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.Status == want
	})
}

func (f *fixture) pending(t *testing.T, id string) []*dbcloud.Operation {
	t.Helper()
	var ops []*dbcloud.Operation
	f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
		ops, err = tx.ListOperations(dbcloud.OperationFilter{ResourceID: id, Pending: true})
		return err
	})
	return ops
}

func TestEngine_Lifecycle(t *testing.T) {
	f := newFixture(t)
	f.engine(t, "a")
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	id := v.Service.ID
	got := f.waitStatus(t, id, dbcloud.StatusReady)
	if got.Service.ObservedGeneration != got.Service.Generation || len(f.pending(t, id)) != 0 {
		t.Errorf("READY with observed %d of %d and %d pending", got.Service.ObservedGeneration, got.Service.Generation, len(f.pending(t, id)))
	}
	if _, err := f.cloud.StopService(f.ctx, f.pid, id); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, id, dbcloud.StatusPaused)
	if _, err := f.cloud.ResizeService(f.ctx, f.pid, id, "2000", "8"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cloud.StartService(f.ctx, f.pid, id); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, id, dbcloud.StatusReady)
	f.prov.mu.Lock()
	if size := f.prov.sizes[id]; size.CPUMillis != 2000 || !f.prov.running[id] {
		t.Errorf("runtime has size %v running %v; want the resize applied at start", size, f.prov.running[id])
	}
	f.prov.mu.Unlock()
	if err := f.cloud.DeleteService(f.ctx, f.pid, id); err != nil {
		t.Fatal(err)
	}
	f.waitFor(t, id, "gone", func(_ *cloud.ServiceView, err error) bool { return dbcloud.IsNotFound(err) })
	var ports map[int]string
	f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) { ports, err = tx.ListPorts(); return err })
	for p, owner := range ports {
		if owner == id {
			t.Errorf("port %d still held by deleted service", p)
		}
	}
	if !f.prov.wasDeleted(id) {
		t.Error("runtime was not asked to delete")
	}
}

func TestEngine_RetryThenSucceed(t *testing.T) {
	f := newFixture(t)
	v, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	id := v.Service.ID
	f.prov.fail[id] = []error{errors.New("disk busy"), errors.New("disk busy")}
	f.engine(t, "a")
	f.waitStatus(t, id, dbcloud.StatusReady)
	if n := f.prov.count(id); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}
}

func TestEngine_TerminalFailure(t *testing.T) {
	f := newFixture(t)
	v, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	id := v.Service.ID
	f.prov.fail[id] = []error{dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindUnavailable, "The host has no room for this size."))}
	f.engine(t, "a")
	got := f.waitStatus(t, id, dbcloud.StatusUnstable)
	if got.Service.StatusReason != "The host has no room for this size." {
		t.Errorf("reason %q", got.Service.StatusReason)
	}
	if f.prov.count(id) != 1 || len(f.pending(t, id)) != 0 {
		t.Errorf("terminal error tried %d times, %d still pending", f.prov.count(id), len(f.pending(t, id)))
	}
}

func TestEngine_GivesUpAfterMaxAttempts(t *testing.T) {
	f := newFixture(t)
	v, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	id := v.Service.ID
	f.prov.fail[id] = []error{errors.New("x"), errors.New("x"), errors.New("x"), errors.New("x")}
	f.engine(t, "a")
	got := f.waitStatus(t, id, dbcloud.StatusUnstable)
	if got.Service.StatusReason == "" || f.prov.count(id) != 3 {
		t.Errorf("gave up after %d attempts with reason %q; want 3 and a reason", f.prov.count(id), got.Service.StatusReason)
	}
}

// TestEngine_FailingResizeSupersededBySmaller: a resize that keeps failing
// does not lock the service: a smaller resize supersedes it, and the
// service reaches READY at the smaller size (issue 14).
func TestEngine_FailingResizeSupersededBySmaller(t *testing.T) {
	f := newFixture(t)
	f.engine(t, "a")
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusReady)
	f.prov.mu.Lock()
	f.prov.failSize = &dbcloud.Size{CPUMillis: 4000, MemoryGBs: 16}
	f.prov.mu.Unlock()
	if _, err := f.cloud.ResizeService(f.ctx, f.pid, id, "4000", "16"); err != nil {
		t.Fatal(err)
	}
	// Wait until the resize has failed at least once.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ops := f.pending(t, id)
		if len(ops) > 0 && ops[0].Attempts > 0 {
			break
		}
		if v, _ := f.cloud.GetService(f.ctx, f.pid, id); v != nil && v.Service.Status == dbcloud.StatusUnstable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the resize never failed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := f.cloud.ResizeService(f.ctx, f.pid, id, "1000", "4"); err != nil {
		t.Fatalf("a smaller resize over a failing one: %v", err)
	}
	got := f.waitFor(t, id, "READY at 1000/4", func(v *cloud.ServiceView, err error) bool {
		return err == nil && v.Service.Status == dbcloud.StatusReady && v.Service.Spec.Size.CPUMillis == 1000
	})
	f.prov.mu.Lock()
	defer f.prov.mu.Unlock()
	if f.prov.sizes[id].CPUMillis != 1000 || len(f.pending(t, id)) != 0 {
		t.Errorf("runtime size %v, %d pending; want 1000/4 and nothing pending (%s)", f.prov.sizes[id], len(f.pending(t, id)), got.Service.Status)
	}
}

func TestEngine_RepairsDeadPrimary(t *testing.T) {
	f := newFixture(t)
	f.engine(t, "a")
	v, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusReady)
	f.waitFor(t, id, "metrics", func(v *cloud.ServiceView, err error) bool { return err == nil && v.Service.Metrics != nil })
	before := f.prov.count(id)
	f.prov.mu.Lock()
	f.prov.block = make(chan struct{}) // hold the repair so UNSTABLE is visible
	f.prov.running[id] = false
	f.prov.mu.Unlock()
	f.waitStatus(t, id, dbcloud.StatusUnstable)
	f.prov.mu.Lock()
	close(f.prov.block)
	f.prov.mu.Unlock()
	f.waitStatus(t, id, dbcloud.StatusReady)
	if f.prov.count(id) != before+1 {
		t.Errorf("repair ran %d times, want 1", f.prov.count(id)-before)
	}
}

func TestEngine_LeaseHeldElsewhere(t *testing.T) {
	f := newFixture(t)
	v, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	id := v.Service.ID
	err := f.store.Update(t.Context(), func(tx dbcloud.Tx) error {
		_, err := tx.AcquireLease(id, "other-process", time.Now(), time.Now().Add(time.Hour))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f.engine(t, "a")
	// The engine has polled the leased service's pending create, and worked,
	// once a service created after it started is READY: every dispatch
	// offers both.
	other, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "other"})
	f.waitStatus(t, other.Service.ID, dbcloud.StatusReady)
	if n := f.prov.count(id); n != 0 {
		t.Fatalf("worked on a resource leased by another process (%d calls)", n)
	}
	f.store.Update(t.Context(), func(tx dbcloud.Tx) error { return tx.ReleaseLease(id, "other-process") })
	f.waitStatus(t, id, dbcloud.StatusReady)
}

// TestEngine_RestartResumes: a process that stops mid-operation leaves it
// pending; the next process with the same owner finishes it.
func TestEngine_RestartResumes(t *testing.T) {
	f := newFixture(t)
	f.prov.block = make(chan struct{})
	e1 := f.engine(t, "node-1")
	v, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusConfiguring)
	e1.Close()
	if len(f.pending(t, id)) != 1 {
		t.Fatal("the create is not pending after the engine stopped")
	}
	f.prov.mu.Lock()
	f.prov.block = nil
	f.prov.mu.Unlock()
	f.engine(t, "node-1")
	f.waitStatus(t, id, dbcloud.StatusReady)
}
