// Package engine drives every resource from its observed state to its
// desired state. It is level-triggered: a pending operation says "look at
// this resource", and the engine then makes the whole resource match its
// current spec, whatever happened before (a crash, a lost lease, a retry).
// Durable rows are the truth; nothing in memory needs to survive a restart.
package engine

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"dbcloud/history"
	"dbcloud/internal/supervise"

	"dbcloud"
)

// Engine reconciles resources with pending operations, and watches running
// services so that a crashed postmaster is noticed and restarted.
type Engine struct {
	Store       dbcloud.Store
	Provisioner dbcloud.Provisioner
	// Network provides VPC attachments and peerings; without one, those
	// operations wait.
	Network dbcloud.Network
	Logger  *slog.Logger
	// Owner names this control-plane process in leases. A process that
	// restarts with the same Owner takes its old leases back at once.
	Owner string
	// Workers bounds how many resources are reconciled at once.
	Workers int
	// LeaseTTL is how long a lease holds without renewal; it is renewed
	// every third of it while work goes on. It bounds how long the
	// resources of a plane that died wait for another plane: the takeover
	// time is at most LeaseTTL plus PollInterval.
	LeaseTTL time.Duration
	// PollInterval is how often pending work is looked for without a poke.
	PollInterval time.Duration
	// HealthInterval is how often running services are checked.
	HealthInterval time.Duration
	// MetricsInterval is how often usage is written to the store.
	MetricsInterval time.Duration
	// BackupInterval is how often READY services are offered to the
	// provisioner's MaintainBackups (which decides what is due); 0 never.
	BackupInterval time.Duration
	// CredentialInterval is how often expired and revoked credentials'
	// roles are looked for (credentials.go); 0 never.
	CredentialInterval time.Duration
	// IdleUnit is how long one second of a service's auto-pause
	// idle_seconds lasts: a second; shorter only in tests (autopause.go).
	IdleUnit time.Duration
	// MaxAttempts is how many retryable failures a change may have before
	// it is failed and the service shown UNSTABLE.
	MaxAttempts int
	// Now is injected so tests can control time.
	Now func() time.Time
	// History, when set, keeps every metrics sample over time (history.go).
	History *history.Series
	// Observe, when set, is told of each reconcile: its kind ("service",
	// "peering", "replica_set", or "repair" for the health loop's restart
	// of a service), how long it took and its error.
	Observe func(kind string, d time.Duration, err error)

	queueDepth atomic.Int64 // pending operations at the last dispatch
	// lastChange is when a worker of this process last began or ended
	// (UnixNano): the backup loop yields to changes (backup.go).
	lastChange atomic.Int64
	leasesHeld atomic.Int64

	wake   chan struct{}
	cancel context.CancelFunc
	// group runs the loops, workers and lease renewals: a panic in one is
	// recovered (supervise.go), and Close waits for them all.
	group supervise.Group

	mu        sync.Mutex
	active    map[string]bool      // resources a worker of this process has
	notBefore map[string]time.Time // backoff per resource
	// repairAfter holds back the health loop from services whose
	// provisioning failed for good; a new operation is not held back.
	repairAfter map[string]time.Time
	measured    map[string]time.Time // last metrics write per service
	idleSince   map[string]time.Time // since when each auto-pause service has had no client (autopause.go)
	pruned      time.Time            // last prune of the history

	watchList watchList // the health loop's last list (health.go)
}

// GiveUpPause is how long the engine leaves a service alone after its
// provisioning failed for good, before the health loop tries it again.
const GiveUpPause = time.Minute

// DefaultLeaseTTL is the lease TTL New sets: renewed every 2 s, so a
// plane that dies leaves its resources to another within about 6 s, and a
// store that stalls for less than 4 s costs no lease.
const DefaultLeaseTTL = 6 * time.Second

// New returns an engine with the default intervals.
func New(store dbcloud.Store, p dbcloud.Provisioner, owner string, logger *slog.Logger) *Engine {
	return &Engine{
		Store: store, Provisioner: p, Owner: owner, Logger: logger,
		Workers: 4, LeaseTTL: DefaultLeaseTTL, PollInterval: time.Second,
		HealthInterval: time.Second, MetricsInterval: 5 * time.Second, BackupInterval: 5 * time.Second, CredentialInterval: DefaultCredentialInterval, MaxAttempts: 8,
		Now: time.Now,
	}
}

// Open starts the engine's loops.
func (e *Engine) Open() error {
	if e.Provisioner == nil || e.Store == nil || e.Owner == "" {
		return errors.New("engine: store, provisioner and owner are required")
	}
	e.wake = make(chan struct{}, 1)
	e.active, e.notBefore, e.measured = map[string]bool{}, map[string]time.Time{}, map[string]time.Time{}
	e.repairAfter, e.idleSince = map[string]time.Time{}, map[string]time.Time{}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.group.Logger = e.Logger
	e.holdPausedAtOpen(ctx)
	e.group.Loop(ctx, supervise.Task{Name: "engine dispatch loop"}, e.dispatchLoop)
	e.group.Loop(ctx, supervise.Task{Name: "engine health loop"}, e.healthLoop)
	if b := dbcloud.CapabilitiesOf(e.Provisioner).Maintainer; b != nil && e.BackupInterval > 0 {
		e.group.Loop(ctx, supervise.Task{Name: "engine backup loop"}, func(ctx context.Context) { e.backupLoop(ctx, b) })
	}
	if rt := dbcloud.CapabilitiesOf(e.Provisioner).Credentials; rt != nil && e.CredentialInterval > 0 {
		e.group.Loop(ctx, supervise.Task{Name: "engine credential loop"}, func(ctx context.Context) { e.credentialLoop(ctx, rt) })
	}
	// A failure the runtime sees as it happens is checked at once
	// (health.go), not at the next health round.
	if w := dbcloud.CapabilitiesOf(e.Provisioner).Failures; w != nil {
		w.WatchFailures(func(projectID, id string) { e.failureNoticed(ctx, projectID, id) })
	}
	return nil
}

// Close stops the loops and waits for work in flight to stop. Leases of
// unfinished work expire, or are taken back by the next start.
func (e *Engine) Close() error {
	if w := dbcloud.CapabilitiesOf(e.Provisioner).Failures; w != nil {
		w.WatchFailures(nil)
	}
	if e.cancel != nil {
		e.cancel()
		e.group.Wait()
	}
	return nil
}

// Notify tells the engine that new work may be pending. It never blocks.
func (e *Engine) Notify() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *Engine) now() time.Time { return e.Now().UTC() }

func (e *Engine) dispatchLoop(ctx context.Context) {
	t := time.NewTicker(e.PollInterval)
	defer t.Stop()
	sem := make(chan struct{}, max(1, e.Workers))
	// Wakes have slots of their own: a client holds its connection open
	// through each, and none may wait for a create or a delete to end
	// (with the workers all deleting, a wake waited past the client's
	// 30 s). Admission bounds how many services run, wakes included.
	wakes := make(chan struct{}, max(1, e.Workers))
	for {
		e.dispatch(ctx, sem, wakes)
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-t.C:
		}
	}
}

// dispatch starts a worker for each resource with pending operations that
// no worker of this process has and that is not backing off.
func (e *Engine) dispatch(ctx context.Context, sem, wakes chan struct{}) {
	var ops []*dbcloud.Operation
	err := e.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		ops, err = tx.ListOperations(dbcloud.OperationFilter{Pending: true})
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			e.Logger.Warn("list pending operations", "error", err)
		}
		return
	}
	e.queueDepth.Store(int64(len(ops)))
	// Wakes first: the loop below waits for a free slot in list order.
	slices.SortStableFunc(ops, func(a, b *dbcloud.Operation) int {
		return cmp.Compare(wakeRank(a), wakeRank(b))
	})
	seen := map[string]bool{}
	for _, op := range ops {
		if seen[op.ResourceID] || e.kindOf(op.Type) == "" {
			continue
		}
		seen[op.ResourceID] = true
		e.mu.Lock()
		busy := e.active[op.ResourceID] || e.now().Before(e.notBefore[op.ResourceID])
		if !busy {
			e.active[op.ResourceID] = true
		}
		e.mu.Unlock()
		if busy {
			continue
		}
		slots := sem
		if op.Type == dbcloud.OpWake {
			slots = wakes
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		e.lastChange.Store(time.Now().UnixNano())
		kind := e.kindOf(op.Type)
		e.group.Go(supervise.Task{
			Name: "engine worker", Attrs: []any{"resource", op.ResourceID, "kind", kind},
			// A panic outside the reconcile (which reconcileSafely
			// records): the resource waits a backoff before the next try.
			OnPanic: func(*supervise.PanicError) { e.backoff(op.ResourceID, 1) },
		}, func() {
			defer func() { <-slots }()
			defer func() {
				e.mu.Lock()
				delete(e.active, op.ResourceID)
				e.lastChange.Store(time.Now().UnixNano())
				e.mu.Unlock()
				e.Notify() // the resource may have more pending work
			}()
			e.work(ctx, op.ResourceID, kind, op.ProjectID)
		})
	}
}

// wakeRank orders wakes before other operations.
func wakeRank(op *dbcloud.Operation) int {
	if op.Type == dbcloud.OpWake {
		return 0
	}
	return 1
}

// kindOf says which reconciler handles an operation type; "" means none in
// this engine, so the operation waits for a provisioner that has one.
func (e *Engine) kindOf(t dbcloud.OperationType) string {
	switch t {
	case dbcloud.OpCreateService, dbcloud.OpDeleteService, dbcloud.OpStartService, dbcloud.OpStopService,
		dbcloud.OpResizeService, dbcloud.OpSetHA, dbcloud.OpSetPooler, dbcloud.OpAttachVPC, dbcloud.OpDetachVPC,
		dbcloud.OpAutoPause, dbcloud.OpWake, dbcloud.OpUpgradeService:
		return "service"
	case dbcloud.OpCreatePeering, dbcloud.OpDeletePeering:
		return "peering"
	case dbcloud.OpCreateReplicaSet, dbcloud.OpDeleteReplicaSet, dbcloud.OpResizeReplicaSet, dbcloud.OpSetReplicaPooler:
		if _, ok := e.replicaSets(); ok {
			return "replica_set"
		}
	}
	return ""
}

// work reconciles one resource while holding its lease. The transaction
// that takes the lease also marks the resource's operations started and,
// for a service, reads it and shows a queued one CONFIGURING: one store
// write where there were three, on the path of every create.
func (e *Engine) work(ctx context.Context, resourceID, kind, projectID string) {
	var (
		svc    *dbcloud.Service
		queued bool
	)
	ctx, release, ok := e.lease(ctx, resourceID, func(tx dbcloud.Tx) (err error) {
		if err := markStartedTx(tx, resourceID, e.now()); err != nil {
			return err
		}
		if kind == "service" {
			svc, queued, err = startProvisioning(tx, projectID, resourceID)
		}
		return err
	})
	if !ok {
		return
	}
	defer release()
	if queued {
		e.Logger.Info("service status", "service", resourceID, "from", dbcloud.StatusQueued, "to", dbcloud.StatusConfiguring)
	}
	start := time.Now()
	err := e.reconcileSafely(ctx, kind, svc, projectID, resourceID)
	if e.Observe != nil && ctx.Err() == nil {
		e.Observe(kind, time.Since(start), err)
	}
	if err != nil && ctx.Err() == nil {
		e.Logger.Warn("reconcile", "resource", resourceID, "error", err)
	}
}

// QueueDepth is how many operations were pending at the last dispatch.
func (e *Engine) QueueDepth() int { return int(e.queueDepth.Load()) }

// LeasesHeld is how many resource leases this process holds now.
func (e *Engine) LeasesHeld() int { return int(e.leasesHeld.Load()) }

// lease takes the resource's lease and keeps renewing it; the returned
// context ends if the lease is lost, so no two processes act at once.
// begin, if not nil, runs in the transaction that takes the lease (only if
// it is taken): what a worker reads or records first is seen together with
// the lease, in one store write.
//
// A renewal that fails with a store error is retried at the next tick;
// the work is stopped once the lease may have expired (a third of the TTL
// before, measured from the last renewal that reached the store), so
// another plane taking it over never finds this one still working.
func (e *Engine) lease(parent context.Context, resourceID string, begin func(tx dbcloud.Tx) error) (context.Context, func(), bool) {
	acquire := func(ctx context.Context, now time.Time, begin func(tx dbcloud.Tx) error) (bool, error) {
		var ok bool
		err := e.Store.Update(ctx, func(tx dbcloud.Tx) (err error) {
			ok, err = tx.AcquireLease(resourceID, e.Owner, now, now.Add(e.LeaseTTL))
			if err == nil && ok && begin != nil {
				err = begin(tx)
			}
			return err
		})
		return ok, err
	}
	held := e.now()
	if ok, err := acquire(parent, held, begin); err != nil || !ok {
		if err != nil && parent.Err() == nil {
			e.Logger.Warn("acquire lease", "resource", resourceID, "error", err)
		}
		return nil, nil, false
	}
	// The lease counts from before the statement, and a store may answer
	// well after its commit (the PostgreSQL store waits until the other
	// planes have applied a write that moved a change counter, as begin's
	// do): with less than two thirds of it left, it is renewed before any
	// work starts, as the renewals would have; if another plane has taken
	// it meanwhile, this one does nothing.
	if now := e.now(); now.After(held.Add(e.LeaseTTL / 3)) {
		if ok, err := acquire(parent, now, nil); err != nil || !ok {
			e.Logger.Warn("lease expired while it was taken", "resource", resourceID, "taken_ms", now.Sub(held).Milliseconds(), "error", err)
			return nil, nil, false
		}
		held = now
	}
	e.leasesHeld.Add(1)
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	e.group.Go(supervise.Task{
		Name: "lease renewal", Attrs: []any{"resource", resourceID},
		// Without renewals the lease expires under the work: stop it.
		OnPanic: func(*supervise.PanicError) { cancel() },
	}, func() {
		defer close(done)
		t := time.NewTicker(e.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				// The expiry is counted from before the statement, so a slow
				// store only makes this plane stop early, never late.
				now := e.now()
				rctx, rcancel := context.WithTimeout(ctx, e.LeaseTTL/3)
				ok, err := acquire(rctx, now, nil)
				rcancel()
				if ctx.Err() != nil {
					return
				}
				switch {
				case ok:
					held = now
					continue
				case err == nil:
					e.Logger.Error("lease lost; stopping work on the resource", "resource", resourceID)
				case e.now().Before(held.Add(e.LeaseTTL * 2 / 3)):
					e.Logger.Warn("renew lease; retrying", "resource", resourceID, "error", err)
					continue
				default:
					e.Logger.Error("lease not renewed in time; stopping work on the resource", "resource", resourceID, "error", err)
				}
				cancel()
				return
			}
		}
	})
	release := func() {
		cancel()
		<-done
		defer e.leasesHeld.Add(-1)
		// Release with a fresh context: the work's context may be over.
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		if err := e.Store.Update(rctx, func(tx dbcloud.Tx) error { return tx.ReleaseLease(resourceID, e.Owner) }); err != nil {
			e.Logger.Warn("release lease", "resource", resourceID, "error", err)
		}
	}
	return ctx, release, true
}

// claimLeased is claimForRepair and the resource's lease together: what a
// background job on a resource (a snapshot, a metrics write) needs, so
// that neither another worker of this process nor another plane works on
// it meanwhile. It reports false, holding nothing, when either is taken.
func (e *Engine) claimLeased(ctx context.Context, id string) (context.Context, func(), bool) {
	if !e.claimForRepair(id) {
		return nil, nil, false
	}
	lctx, release, ok := e.lease(ctx, id, nil)
	if !ok {
		e.endRepair(id)
		return nil, nil, false
	}
	return lctx, func() { release(); e.endRepair(id) }, true
}

// backoff delays the next attempt on a resource: capped exponential with
// jitter, so a failing runtime is not hammered.
func (e *Engine) backoff(resourceID string, attempts int) time.Duration {
	d := min(time.Duration(1<<min(attempts, 6))*250*time.Millisecond, 30*time.Second)
	d = d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
	e.mu.Lock()
	e.notBefore[resourceID] = e.now().Add(d)
	e.mu.Unlock()
	return d
}

func (e *Engine) clearBackoff(resourceID string) {
	e.mu.Lock()
	delete(e.notBefore, resourceID)
	delete(e.repairAfter, resourceID)
	e.mu.Unlock()
}

// every calls fn every interval until ctx ends: the shape of the engine's
// periodic loops.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}
