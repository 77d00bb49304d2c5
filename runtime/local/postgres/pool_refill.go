package postgres

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"dbcloud/internal/supervise"
)

func (m *Instances) kickRefill() {
	select {
	case m.refill <- struct{}{}:
	default:
	}
}

// noteTake tells the pool that a create took (or wanted) a prepared
// cluster when ready were left before it. A take from a pool already half
// empty means creates come faster than the pool refills: the target
// doubles, up to PoolMaxSize, so the refill prepares ahead of the burst;
// it shrinks back after poolIdle without takes (refillLoop).
func (m *Instances) noteTake(ready int) {
	m.poolMu.Lock()
	defer m.poolMu.Unlock()
	m.lastTake = time.Now()
	if target := m.targetLocked(); ready <= target/2 && target < m.PoolMaxSize {
		m.burstTarget = min(max(2*target, 1), m.PoolMaxSize)
		m.Logger.Info("creates come faster than the pool refills; preparing ahead",
			"ready", ready, "target", m.burstTarget, "max", m.PoolMaxSize)
	}
	m.kickRefill()
}

// urgent says whether creates are about to wait for the refill: one
// prepared cluster or none is left. Until then the refill waits for a
// pause in the creates: a copy of the template beside a create's instance
// start doubles or triples that create's time, niced or not (on ext4 the
// fsyncs of its configuration wait for a journal commit that carries the
// copy's thousand file creates too). Refilled from half the target on, as
// it was, a warm pool of 20 served its first 9 creates in 65-130 ms and
// most of the rest in 200-550 ms.
func (m *Instances) urgent() bool {
	return len(m.readyEntries()) <= 1
}

// bursting says whether the pool's target has grown for a burst of
// creates that has not yet ended (poolIdle without takes ends it).
func (m *Instances) bursting() bool {
	m.poolMu.Lock()
	defer m.poolMu.Unlock()
	return m.burstTarget > 0
}

// refillLoop keeps the pool at its target: it prepares clusters, several
// at once when more than one is missing (prepareSlots bounds how many),
// and otherwise sleeps until a take wakes it or poolRecheck passes. While
// more than one cluster is left, it starts poolRefillDelay after the last
// take, so the refill does not compete with the creates coming right
// then; with one or none left, poolUrgentDelay after it (the create that
// just took one starts its instance first), and at once for a create
// that waits or during a burst (refillAt).
func (m *Instances) refillLoop(ctx context.Context) {
	backoff := poolBackoffMin
	// notBefore postpones the refill after a take; retryAt after a failed
	// preparation, which no take cuts short.
	var notBefore, retryAt time.Time
	inFlight := 0
	done := make(chan error)
	defer func() {
		for ; inFlight > 0; inFlight-- {
			<-done
		}
	}()
	for {
		m.shrinkIfIdle(ctx)
		ready := len(m.readyEntries())
		missing := m.PoolTarget() - ready - inFlight
		wait := poolRecheck
		if missing > 0 && inFlight < m.prepareSlots() {
			if d := time.Until(later(later(notBefore, retryAt), m.settleUntil(time.Now()))); d > 0 {
				wait = d
			} else {
				// Background work unless creates may soon wait for it:
				// the instances that creates start come first.
				nice := 0
				if !m.urgent() {
					nice = prepareNice
				}
				inFlight++
				// A panic preparing one cluster is that cluster's
				// failure, retried with the backoff, not the process's.
				go func() { done <- supervise.Call(func() error { return m.addToPool(ctx, nice) }) }()
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case err := <-done:
			inFlight--
			switch {
			case err == nil:
				backoff = poolBackoffMin
			case ctx.Err() != nil:
				return
			default:
				m.Logger.Error("prepare pool cluster", "error", err, "retry_in", backoff.String())
				retryAt = time.Now().Add(backoff)
				backoff = min(2*backoff, poolBackoffMax)
			}
		case <-m.refill:
			notBefore = refillAt(time.Now(), notBefore, m.waiting.Load() > 0, m.urgent(), m.bursting())
		case <-time.After(wait):
		}
	}
}

// poolSettleMax bounds how long the refill holds off for a claimed
// entry whose service has not served: a create that failed never says.
const poolSettleMax = 10 * time.Second

// noteClaimed records that a create of this process claimed an entry to
// dir at when: the refill holds off until its service has served
// (Settled) or poolSettleMax has passed.
func (m *Instances) noteClaimed(dir string, when time.Time) {
	m.poolMu.Lock()
	defer m.poolMu.Unlock()
	if m.settling == nil {
		m.settling = map[string]time.Time{}
	}
	m.settling[dir] = when
}

// Settled says that the service whose pool entry was claimed to one of
// dirs has served its first clients (its password set, its endpoint up),
// so the refill may go on: once no create is starting, poolRefillDelay
// after this. Directories no claim went to are ignored.
func (m *Instances) Settled(dirs ...string) {
	m.poolMu.Lock()
	n := len(m.settling)
	for _, dir := range dirs {
		delete(m.settling, dir)
	}
	settled := len(m.settling) < n
	m.poolMu.Unlock()
	if settled {
		m.kickRefill()
	}
}

// ClaimsStarting is how many entries creates of this process claimed
// whose service has not served yet (Settled), as far as the refill
// waits for them: claims older than poolSettleMax no longer count. The
// runtime's tests read it to see that a served service ends the hold.
func (m *Instances) ClaimsStarting() int {
	m.poolMu.Lock()
	defer m.poolMu.Unlock()
	m.pruneSettling(time.Now())
	return len(m.settling)
}

// pruneSettling forgets the claims the refill no longer waits for (older
// than poolSettleMax at now) and returns when the rest stop holding it
// (the zero time when none is left). m.poolMu is held.
func (m *Instances) pruneSettling(now time.Time) time.Time {
	var until time.Time
	for dir, at := range m.settling {
		if now.Sub(at) >= poolSettleMax {
			delete(m.settling, dir)
			continue
		}
		until = later(until, at.Add(poolSettleMax))
	}
	return until
}

// settleUntil is when the refill may start as far as the creates that
// claimed entries are concerned: the zero time when none is starting, or
// when the pool cannot wait for them (a create waits, one cluster or none
// is left, a burst is on); else poolSettleMax after the latest claim.
//
// Why: a preparation is a copy of the template, pg_resetwal and a syncfs,
// and where the pool is on a btrfs image each of its syncs is a
// transaction commit of the whole filesystem (with quota accounting of
// every cloned extent), which blocks the WAL flushes of every instance on
// it: there a PostgreSQL WAL flush took 17-34 ms at the median and
// 200-300 ms at p90 on a busy host, against 0.4 ms and 1.8 ms on ext4,
// and the slow ones ended with a commit of the refill's syncfs. A create
// that started its instance beside a preparation waited so for its
// password's ALTER ROLE: 100-600 ms, against 17-32 ms on ext4.
func (m *Instances) settleUntil(now time.Time) time.Time {
	m.poolMu.Lock()
	until := m.pruneSettling(now)
	bursting := m.burstTarget > 0
	m.poolMu.Unlock()
	if until.IsZero() || bursting || m.waiting.Load() > 0 || m.urgent() {
		return time.Time{}
	}
	return until
}

// refillAt is when the refill may start after a take, given the time it
// was postponed to before (notBefore), whether a create waits for a
// cluster, whether one or none is left (urgent) and whether a burst is
// on: at once (the zero time) for a waiting create, and during a burst
// when urgent, since the next create comes before the one that just took
// a cluster would have started its instance, so waiting for it only makes
// the next create wait longer; poolUrgentDelay from now when urgent
// otherwise; else poolRefillDelay after the last take.
func refillAt(now, notBefore time.Time, waiting, urgent, bursting bool) time.Time {
	switch {
	case waiting, urgent && bursting:
		return time.Time{}
	case urgent:
		return now.Add(poolUrgentDelay)
	default:
		return later(notBefore, now.Add(poolRefillDelay))
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// prepareSlots is how many clusters may be prepared at once: one per CPU
// (initdb keeps a core busy), and no more than fit in PoolMemoryShare of
// the memory available now, at prepareMemory each; always at least one.
func (m *Instances) prepareSlots() int {
	slots := runtime.NumCPU()
	if avail, err := MemAvailable(); err == nil && m.PoolMemoryShare > 0 {
		slots = min(slots, int(m.PoolMemoryShare*float64(avail)/prepareMemory))
	}
	return max(1, slots)
}

// shrinkIfIdle returns the target to PoolSize once no create took a
// cluster for poolIdle, and removes the clusters (and OS users) prepared
// beyond it: the newest first, so the oldest go to creates.
func (m *Instances) shrinkIfIdle(ctx context.Context) {
	m.poolMu.Lock()
	if m.burstTarget == 0 || time.Since(m.lastTake) < poolIdle {
		m.poolMu.Unlock()
		return
	}
	m.burstTarget = 0
	m.poolMu.Unlock()
	ready := m.readyEntries()
	for i := len(ready) - 1; i >= m.PoolSize; i-- {
		// Renamed first, so that no create takes it while it goes.
		gone := poolGonePrefix + strings.TrimPrefix(ready[i], poolReadyPrefix)
		if err := os.Rename(filepath.Join(m.PoolDir, ready[i]), filepath.Join(m.PoolDir, gone)); err != nil {
			continue // taken meanwhile
		}
		if err := m.removeEntry(ctx, gone); err != nil {
			m.Logger.Warn("remove surplus pool entry", "entry", gone, "error", err)
		}
	}
	m.Logger.Info("pool idle; back to its size", "size", m.PoolSize)
}
