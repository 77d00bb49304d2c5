package engine_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/cloud"
	"dbcloud/engine"
)

// syncBuffer is a log destination the test reads while the engine writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logTo has the engine log to b.
func logTo(b *syncBuffer) func(e *engine.Engine) {
	return func(e *engine.Engine) { e.Logger = slog.New(slog.NewTextHandler(b, nil)) }
}

// TestEngine_PanicInReconcile: a runtime that panics while it ensures one
// service costs that service an attempt, not the process: the other
// service reaches READY, the panic is logged with the service it hit, and
// the panicking service is retried with its backoff until it works; one
// that panics every time is given up on (UNSTABLE) after MaxAttempts.
func TestEngine_PanicInReconcile(t *testing.T) {
	f := newFixture(t)
	bad, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "bad"})
	if err != nil {
		t.Fatal(err)
	}
	good, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "good"})
	if err != nil {
		t.Fatal(err)
	}
	broken, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "broken"})
	if err != nil {
		t.Fatal(err)
	}
	badID, brokenID := bad.Service.ID, broken.Service.ID
	f.prov.mu.Lock()
	f.prov.panics[badID] = 2 // under the fixture's MaxAttempts of 3
	f.prov.panics[brokenID] = 100
	f.prov.mu.Unlock()
	logs := &syncBuffer{}
	f.engineWith(t, "a", logTo(logs))

	f.waitStatus(t, good.Service.ID, dbcloud.StatusReady)
	f.waitStatus(t, badID, dbcloud.StatusReady)
	if n := f.prov.count(badID); n != 3 {
		t.Errorf("%d ensures of the panicking service; want 3 (two panics, then the one that worked)", n)
	}
	var ops []*dbcloud.Operation
	f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
		ops, err = tx.ListOperations(dbcloud.OperationFilter{ResourceID: badID})
		return err
	})
	if len(ops) != 1 {
		t.Fatalf("%d operations; want the create", len(ops))
	}
	if got := ops[0]; got.Attempts != 2 || got.State != dbcloud.OpSucceeded {
		t.Errorf("create %s after %d failed attempts; want succeeded after 2", got.State, got.Attempts)
	}
	// One that always panics is given up on as after any error.
	f.waitStatus(t, brokenID, dbcloud.StatusUnstable)
	if n, pending := f.prov.count(brokenID), len(f.pending(t, brokenID)); n != 3 || pending != 0 {
		t.Errorf("service that always panics: %d ensures, %d operations pending; want 3 (MaxAttempts) and none", n, pending)
	}
	var panicked, retried bool
	for _, line := range strings.Split(logs.String(), "\n") {
		if !strings.Contains(line, badID) {
			continue
		}
		panicked = panicked || (strings.Contains(line, "level=ERROR") && strings.Contains(line, "assignment to entry in nil map") && strings.Contains(line, "stack="))
		retried = retried || (strings.Contains(line, "reconcile failed; retrying") && strings.Contains(line, "panic"))
	}
	if !panicked || !retried {
		t.Errorf("logs (panic logged %v, retry says it panicked %v):\n%s", panicked, retried, logs.String())
	}
}

// TestEngine_PanicInHealthCheck: a runtime whose check of one service
// panics every time costs that service its checks, not the health loop:
// the service listed after it still has its dead primary repaired, and the
// panicking one is checked again in later rounds.
func TestEngine_PanicInHealthCheck(t *testing.T) {
	f := newFixture(t)
	logs := &syncBuffer{}
	f.engineWith(t, "a", logTo(logs))
	bad, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "bad"}) // listed first
	good, _ := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "good"})
	badID, goodID := bad.Service.ID, good.Service.ID
	f.waitStatus(t, badID, dbcloud.StatusReady)
	f.waitStatus(t, goodID, dbcloud.StatusReady)

	f.prov.mu.Lock()
	f.prov.checkPanics[badID] = true
	f.prov.block = make(chan struct{}) // hold the repair so UNSTABLE is visible
	f.prov.running[goodID] = false
	f.prov.mu.Unlock()
	f.waitStatus(t, goodID, dbcloud.StatusUnstable)
	f.prov.mu.Lock()
	close(f.prov.block)
	f.prov.mu.Unlock()
	f.waitStatus(t, goodID, dbcloud.StatusReady)

	f.prov.mu.Lock()
	f.prov.checks[badID] = 0
	f.prov.mu.Unlock()
	f.waitFor(t, badID, "checked again after its panics", func(*cloud.ServiceView, error) bool {
		f.prov.mu.Lock()
		defer f.prov.mu.Unlock()
		return f.prov.checks[badID] >= 2
	})
	if !strings.Contains(logs.String(), "nil pointer dereference") || !strings.Contains(logs.String(), "resource="+badID) {
		t.Errorf("no panic logged with the service:\n%s", logs.String())
	}
}

// panickyNetwork provisions peerings, panicking in the first CreatePeering
// calls of each (by its peer VPC) as a buggy provider would.
type panickyNetwork struct {
	dbcloud.Network // only peerings are asked for
	mu              sync.Mutex
	panics, creates map[string]int
}

func (n *panickyNetwork) CreatePeering(ctx context.Context, vpc *dbcloud.VPC, p *dbcloud.Peering) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.creates[p.PeerVPCID]++
	if n.panics[p.PeerVPCID] > 0 {
		n.panics[p.PeerVPCID]--
		var m map[string]int
		m[p.ID]++ // a nil map written
	}
	return "pcx-" + p.ID, nil
}

// TestEngine_PanicInPeeringReconcile: a panic in the network provider is
// the peering's failed attempt, through the peering's own failure path: a
// peering whose provider panics twice is retried with its backoff and
// active once the provider works; one whose provider always panics is
// failed after MaxAttempts, its operation ended, not retried for ever.
func TestEngine_PanicInPeeringReconcile(t *testing.T) {
	f := newFixture(t)
	vpc, err := f.cloud.CreateVPC(f.ctx, f.pid, cloud.VPCCreate{Name: "v", CIDR: "10.1.0.0/16", Region: cloud.DefaultConfig().Regions[0]})
	if err != nil {
		t.Fatal(err)
	}
	peer := func(peerVPC string) *dbcloud.Peering {
		p, err := f.cloud.CreatePeering(f.ctx, f.pid, vpc.ID, cloud.PeeringCreate{PeerAccountID: "123456789012", PeerRegionCode: "us-east-1", PeerVPCID: peerVPC})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	healed, broken := peer("vpc-healed"), peer("vpc-broken")
	// Under and over the fixture's MaxAttempts of 3.
	network := &panickyNetwork{panics: map[string]int{"vpc-healed": 2, "vpc-broken": 100}, creates: map[string]int{}}
	f.engineWith(t, "a", func(e *engine.Engine) { e.Network = network })

	for _, c := range []struct {
		p        *dbcloud.Peering
		status   dbcloud.PeeringStatus
		state    dbcloud.OperationState
		attempts int
	}{
		{healed, dbcloud.PeeringActive, dbcloud.OpSucceeded, 2},
		{broken, dbcloud.PeeringFailed, dbcloud.OpFailed, 3},
	} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := f.cloud.GetPeering(f.ctx, f.pid, vpc.ID, c.p.ID)
			if err == nil && got.Status == c.status {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("peering with %s: %+v, %v; want %s", c.p.PeerVPCID, got, err, c.status)
			}
			time.Sleep(10 * time.Millisecond)
		}
		var ops []*dbcloud.Operation
		f.store.View(t.Context(), func(tx dbcloud.Tx) (err error) {
			ops, err = tx.ListOperations(dbcloud.OperationFilter{ResourceID: c.p.ID})
			return err
		})
		if len(ops) != 1 || ops[0].Attempts != c.attempts || ops[0].State != c.state {
			t.Errorf("peering with %s: %d operations; want one, %s after %d failed attempts", c.p.PeerVPCID, len(ops), c.state, c.attempts)
			for _, op := range ops {
				t.Logf("operation %s: %s after %d attempts", op.Type, op.State, op.Attempts)
			}
		}
	}
}

// panickyStore panics in every write while panics is set, and in the
// next viewPanics reads, as a bug in a store driver would.
type panickyStore struct {
	dbcloud.Store
	panics     atomic.Bool
	viewPanics atomic.Int32
}

// View panics while viewPanics is above 0, counting down.
func (s *panickyStore) View(ctx context.Context, fn func(dbcloud.Tx) error) error {
	if s.viewPanics.Add(-1) >= 0 {
		var m map[string]int
		m["view"]++ // a nil map written
	}
	return s.Store.View(ctx, fn)
}

func (s *panickyStore) Update(ctx context.Context, fn func(dbcloud.Tx) error) error {
	if s.panics.Load() {
		var m map[string]int
		m["update"]++ // a nil map written
	}
	return s.Store.Update(ctx, fn)
}

// TestEngine_PanicRenewingLease: a panic in the goroutine that renews a
// worker's lease stops that work (without renewals the lease would expire
// under it and another plane could start on the same service), and the
// engine goes on: the service is reconciled again once the store works.
func TestEngine_PanicRenewingLease(t *testing.T) {
	f := newFixture(t)
	f.prov.block = make(chan struct{}) // the work holds the lease meanwhile
	store := &panickyStore{Store: f.store}
	logs := &syncBuffer{}
	f.engineWith(t, "a", logTo(logs), func(e *engine.Engine) { e.Store = store })
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusConfiguring)

	store.panics.Store(true)
	f.waitFor(t, id, "work stopped after the renewal panicked", func(*cloud.ServiceView, error) bool {
		f.prov.mu.Lock()
		defer f.prov.mu.Unlock()
		return f.prov.cancelled > 0
	})
	store.panics.Store(false)
	f.prov.mu.Lock()
	close(f.prov.block)
	f.prov.mu.Unlock()
	f.waitStatus(t, id, dbcloud.StatusReady)
	if !strings.Contains(logs.String(), `task="lease renewal"`) {
		t.Errorf("no panic of the lease renewal logged:\n%s", logs.String())
	}
}

// TestEngine_PanicInDispatchLoop: the loop that finds pending work panics
// (its store read, here) and is started again: the service created
// meanwhile still reaches READY.
func TestEngine_PanicInDispatchLoop(t *testing.T) {
	f := newFixture(t)
	store := &panickyStore{Store: f.store}
	store.viewPanics.Store(3) // the dispatch loop's first read is one of them
	logs := &syncBuffer{}
	f.engineWith(t, "a", logTo(logs), func(e *engine.Engine) { e.Store = store })
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, v.Service.ID, dbcloud.StatusReady)
	if !strings.Contains(logs.String(), `task="engine dispatch loop"`) {
		t.Errorf("no panic of the dispatch loop logged:\n%s", logs.String())
	}
}

// TestEngine_PanicInBackupRound: a service whose backup maintenance
// panics every time costs that service its backups, not the round: the
// service listed after it is still maintained round after round, and the
// panicking one is tried again in later rounds.
func TestEngine_PanicInBackupRound(t *testing.T) {
	f := newFixture(t)
	q := &quietBackups{provisioner: f.prov, quiet: map[string]bool{}, maintained: map[string]int{}, panics: map[string]bool{}}
	var ids []string
	for _, name := range []string{"broken", "ok"} { // listed in this order
		v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.Service.ID)
	}
	q.panics[ids[0]] = true
	f.engineWith(t, "a", func(e *engine.Engine) {
		e.Provisioner = q
		e.HealthInterval, e.BackupInterval = time.Hour, 20*time.Millisecond
	})
	for _, id := range ids {
		f.waitStatus(t, id, dbcloud.StatusReady)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		q.mu.Lock()
		broken, ok := q.maintained[ids[0]], q.maintained[ids[1]]
		q.mu.Unlock()
		if broken >= 2 && ok >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("maintained %d times the service that panics (want 2) and %d times the other (want 3)", broken, ok)
		}
	}
}
