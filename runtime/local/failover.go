package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"
)

// Failover on one host (runtime-notes section 3): the runtime is the single
// decider. A dead primary gets failoverGrace to come back, unless its
// postmaster was seen to exit (watch.go): nothing brings that one back. Then the
// endpoint proxy is pointed at nothing, the old primary fenced (its whole
// cgroup killed, and nothing of it left running), the most advanced
// synchronous standby promoted and the proxy pointed at it. The callers'
// ensure rewires the other standbys and rebuilds the old primary.

// primaryDown records that the service's primary is seen dead now, unless
// it already was, and returns since when.
func (rt *Runtime) primaryDown(serviceID string) time.Time {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	since, ok := rt.downSince[serviceID]
	if !ok {
		since = time.Now()
		rt.downSince[serviceID] = since
	}
	return since
}

// primaryUp forgets that the service's primary was seen dead.
func (rt *Runtime) primaryUp(serviceID string) {
	rt.mu.Lock()
	delete(rt.downSince, serviceID)
	rt.mu.Unlock()
	rt.forgetExit(serviceID)
}

// recoverPrimary handles a primary whose postmaster is not running. With
// no standby to take over (a new service, a stopped one), the primary is
// simply started again by the caller. Otherwise it gets failoverGrace to
// come back (its data directory gone, or its postmaster seen to exit: no
// grace), then a standby takes over.
func (rt *Runtime) recoverPrimary(ctx context.Context, svc *dbcloud.Service, base postgres.Spec, st *haState) error {
	pspec := rt.haSpec(svc, base, st, st.Primary)
	_, statErr := tenantfs.Lstat(filepath.Join(pspec.PGData(), "PG_VERSION"))
	dataGone := statErr != nil
	// Standbys that are stopped but intact are started first: they are
	// safe (read-only) and may be the only copy of the data.
	var candidates []int
	for _, n := range st.Members {
		if n == st.Primary || slices.Contains(st.Rebuild, n) {
			continue
		}
		spec := rt.haSpec(svc, base, st, n)
		if _, err := tenantfs.Lstat(filepath.Join(spec.PGData(), "standby.signal")); err != nil {
			continue // never built, or not a standby
		}
		if _, ok := rt.instances.Running(spec); !ok {
			if err := rt.instances.Ensure(ctx, spec); err != nil {
				rt.cfg.Logger.Warn("start standby", "instance", spec.ID, "error", err)
				continue
			}
		}
		candidates = append(candidates, n)
	}
	// With synchronous replicas asked for, a client was told a commit is
	// durable once a synchronous standby had it; any other standby may lack
	// it (while one is being built, or right after a failover, none is
	// synchronous and commits do not wait). Promoting one would lose
	// acknowledged commits that the old primary's intact data still holds:
	// that primary is started again instead.
	if !dataGone && svc.Spec.SyncReplicas > 0 {
		candidates = slices.DeleteFunc(candidates, func(n int) bool {
			return st.SyncCount == 0 || !slices.Contains(st.Sync, n)
		})
	}
	if len(candidates) == 0 {
		return nil
	}
	cause := "primary not running at a check"
	switch {
	case dataGone:
		cause = "data directory gone"
	case rt.exitSeen(svc.ID, pspec):
		// The watched postmaster exited and no other serves the data
		// directory (the caller found none running): it is gone for good.
		cause = "postmaster exited"
	default:
		since := rt.primaryDown(svc.ID)
		for time.Since(since) < failoverGrace {
			if _, ok := rt.instances.Running(pspec); ok {
				return nil // it came back
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return rt.failover(ctx, svc, base, st, candidates, cause)
}

// failover promotes the most advanced candidate standby. Order matters:
// the endpoint refuses connections first, then the old primary is fenced
// (nothing of it runs any more), and only then is a standby promoted and
// the endpoint pointed at it, so the endpoint never reaches two primaries.
func (rt *Runtime) failover(ctx context.Context, svc *dbcloud.Service, base postgres.Spec, st *haState, candidates []int, cause string) error {
	begin := time.Now()
	old := st.Primary
	oldSpec := rt.haSpec(svc, base, st, old)
	rt.cfg.Logger.Warn("primary down; failing over", "service", svc.ID, "primary", oldSpec.ID, "cause", cause)
	if rt.proxyRunning(svc.ID) {
		if err := rt.setProxy(ctx, svc.ID, base.Owner, rt.proxyListen(svc)); err != nil {
			return fmt.Errorf("failover of %s: close endpoint: %w", svc.ID, err)
		}
	}
	// Fence: Stop kills whatever is left in the instance's cgroup (and in
	// its data directory) and waits until nothing is, which also covers a
	// postmaster still running on a deleted data directory.
	if err := rt.stopInstance(ctx, oldSpec, 5*time.Second); err != nil {
		return fmt.Errorf("failover of %s: fence %s: %w", svc.ID, oldSpec.ID, err)
	}
	if cg := rt.cgroups.Of(oldSpec.ID); cg != nil && cg.Exists() {
		if pids, err := cg.Procs(); err != nil || len(pids) > 0 {
			return fmt.Errorf("failover of %s: fence %s: processes %v remain (%v)", svc.ID, oldSpec.ID, pids, err)
		}
	}
	fenced := time.Now()
	// The most advanced standby by WAL received (flushed): with ANY n, every
	// acknowledged commit is on at least one standby, hence on this one.
	best, err := rt.mostAdvanced(ctx, svc, base, st, candidates)
	if err != nil {
		return fmt.Errorf("failover of %s: %w", svc.ID, err)
	}
	defer best.conn.Close(context.WithoutCancel(ctx))
	newSpec := best.spec
	picked := time.Now()
	if err := promote(ctx, best.conn, newSpec); err != nil {
		return fmt.Errorf("failover of %s: %w", svc.ID, err)
	}
	promoted := time.Now()
	st.Primary = best.n
	st.Sync, st.SyncCount = nil, 0 // until the others stream from it
	if !slices.Contains(st.Rebuild, old) {
		st.Rebuild = append(st.Rebuild, old)
	}
	if err := rt.saveHA(svc.ID, st); err != nil {
		return err
	}
	newSpec = rt.haSpec(svc, base, st, best.n)
	// Clients first: the promoted standby takes writes as it is; its
	// config as a primary (no primary_conninfo, no synchronous standby
	// yet: both reloadable) follows.
	if err := rt.setProxy(ctx, svc.ID, base.Owner, rt.proxyListen(svc), net.JoinHostPort(rt.cfg.Host, strconv.Itoa(newSpec.Port))); err != nil {
		return fmt.Errorf("failover of %s: open endpoint: %w", svc.ID, err)
	}
	// Where the time went: fencing, picking the standby, its promotion,
	// and the endpoint's retarget.
	rt.cfg.Logger.Warn("failed over", "service", svc.ID, "from", oldSpec.ID, "to", newSpec.ID,
		"ms", time.Since(begin).Milliseconds(), "fence_ms", fenced.Sub(begin).Milliseconds(),
		"pick_ms", picked.Sub(fenced).Milliseconds(), "promote_ms", promoted.Sub(picked).Milliseconds(),
		"endpoint_ms", time.Since(promoted).Milliseconds())
	if _, err := rt.instances.Reload(ctx, newSpec); err != nil {
		return fmt.Errorf("failover of %s: reconfigure %s: %w", svc.ID, newSpec.ID, err)
	}
	rt.primaryUp(svc.ID)
	// pg_rewind reads the new timeline from the control file, which the
	// first checkpoint after promotion writes.
	if _, err := best.conn.Exec(ctx, "CHECKPOINT"); err != nil {
		rt.cfg.Logger.Warn("checkpoint after promotion", "instance", newSpec.ID, "error", err)
	}
	// The other standbys follow the new primary (the callers' ensureStandby
	// creates their slots and reloads their primary_conninfo).
	return nil
}

// candidate is a standby that may take over, with a superuser session
// on it and how much WAL it has received.
type candidate struct {
	n    int
	spec postgres.Spec
	conn *pgx.Conn
	lsn  int64
	err  error
}

// mostAdvanced returns the candidate standby with the most WAL received,
// its session still open for the promotion. A superuser login starts a
// backend, a hundred milliseconds or more on a busy host while the
// failover's other work runs, so every candidate is asked at once and the
// winner's session is kept rather than opened again to promote it.
func (rt *Runtime) mostAdvanced(ctx context.Context, svc *dbcloud.Service, base postgres.Spec, st *haState, ns []int) (*candidate, error) {
	cs := make([]candidate, len(ns))
	var wg sync.WaitGroup
	for i, n := range ns {
		c := &cs[i]
		c.n, c.spec = n, rt.haSpec(svc, base, st, n)
		wg.Go(func() {
			if c.conn, c.err = rt.instances.Connect(ctx, c.spec, "postgres"); c.err == nil {
				c.lsn, c.err = postgres.ReceivedLSN(ctx, c.conn)
			}
		})
	}
	wg.Wait()
	var best *candidate
	for i := range cs {
		c := &cs[i]
		if c.err != nil {
			rt.cfg.Logger.Warn("read standby position", "instance", c.spec.ID, "error", c.err)
		} else if best == nil || c.lsn > best.lsn {
			best = c
		}
	}
	for i := range cs {
		if c := &cs[i]; c.conn != nil && c != best {
			c.conn.Close(context.WithoutCancel(ctx))
		}
	}
	if best == nil {
		return nil, errors.New("no standby answers")
	}
	return best, nil
}

// promote ends the recovery of the standby conn is a superuser session
// on, and returns once it takes writes. pg_promote(wait => true) and
// pg_ctl promote -w both look every 100 ms, while a promotion here takes a
// few ms: it is asked for without waiting and watched every
// proc.PollInterval instead.
func promote(ctx context.Context, conn *pgx.Conn, spec postgres.Spec) error {
	ctx, cancel := context.WithTimeout(ctx, promoteTimeout)
	defer cancel()
	var signalled bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(false)").Scan(&signalled); err != nil || !signalled {
		return fmt.Errorf("promote %s: %v (signalled %v)", spec.ID, err, signalled)
	}
	for {
		var inRecovery bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
			return fmt.Errorf("promote %s: %w", spec.ID, err)
		}
		if !inRecovery {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("promote %s: %w", spec.ID, ctx.Err())
		case <-time.After(proc.PollInterval):
		}
	}
}
