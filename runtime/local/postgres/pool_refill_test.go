package postgres

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestRefillAt: after a take, the refill waits for a pause in the creates,
// except when a create waits for a cluster or, during a burst, when one
// cluster or none is left: then the next create would wait for it.
func TestRefillAt(t *testing.T) {
	now := time.Date(2026, 11, 25, 18, 0, 0, 0, time.UTC)
	postponed := now.Add(2 * poolRefillDelay)
	for _, tc := range []struct {
		name                      string
		notBefore                 time.Time
		waiting, urgent, bursting bool
		want                      time.Time
	}{
		{"a create waits", postponed, true, false, false, time.Time{}},
		{"a burst, one or none left", postponed, false, true, true, time.Time{}},
		{"one or none left, no burst", postponed, false, true, false, now.Add(poolUrgentDelay)},
		{"a burst, more left", time.Time{}, false, false, true, now.Add(poolRefillDelay)},
		{"a single take", time.Time{}, false, false, false, now.Add(poolRefillDelay)},
		{"postponed further before", postponed, false, false, false, postponed},
	} {
		if got := refillAt(now, tc.notBefore, tc.waiting, tc.urgent, tc.bursting); !got.Equal(tc.want) {
			t.Errorf("%s: refill at %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNoteTake_Burst: a take from a pool at most half full grows its
// target, doubling up to PoolMaxSize, and that is a burst; a take from a
// fuller pool is not.
func TestNoteTake_Burst(t *testing.T) {
	m := &Instances{PoolSize: 2, PoolMaxSize: 8, Logger: slog.New(slog.DiscardHandler)}
	m.noteTake(2)
	if m.bursting() || m.PoolTarget() != 2 {
		t.Fatalf("after a take from a full pool: bursting %v, target %d; want no burst, 2", m.bursting(), m.PoolTarget())
	}
	for _, want := range []int{4, 8, 8} {
		m.noteTake(0)
		if !m.bursting() || m.PoolTarget() != want {
			t.Fatalf("after a take from an empty pool: bursting %v, target %d; want a burst, %d", m.bursting(), m.PoolTarget(), want)
		}
	}
}

// TestSettleUntil: while a create that claimed an entry has not served,
// the refill holds off (poolSettleMax at most), so its preparation's
// syncs do not come beside that create's first commits; it goes on once
// the create has served, and at once when the pool cannot wait: a create
// waits, one cluster or none is left, or a burst is on.
func TestSettleUntil(t *testing.T) {
	now := time.Now()
	newPool := func(t *testing.T, ready int) *Instances {
		m := &Instances{PoolDir: t.TempDir(), PoolSize: 3, PoolMaxSize: 8, refill: make(chan struct{}, 1), Logger: slog.New(slog.DiscardHandler)}
		for i := range ready {
			if err := os.Mkdir(filepath.Join(m.PoolDir, poolReadyPrefix+strconv.Itoa(i)), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	claimed := "/runtime/services/a"

	m := newPool(t, 2)
	if got := m.settleUntil(now); !got.IsZero() {
		t.Fatalf("no claim: the refill holds until %v, want no hold", got)
	}
	m.noteClaimed(claimed, now)
	if got := m.settleUntil(now); !got.Equal(now.Add(poolSettleMax)) {
		t.Fatalf("a claimed create still starting: the refill holds until %v, want %v", got, now.Add(poolSettleMax))
	}
	m.Settled("/runtime/services/other")
	if got := m.settleUntil(now); got.IsZero() {
		t.Fatal("another service's settle ended the hold of a create still starting")
	}
	m.Settled(claimed, "/runtime/services/a/claimed")
	if got := m.settleUntil(now); !got.IsZero() {
		t.Fatalf("the create served: the refill holds until %v, want no hold", got)
	}
	select {
	case <-m.refill:
	default:
		t.Fatal("the create served but the refill was not woken")
	}

	m.noteClaimed(claimed, now)
	if got := m.settleUntil(now.Add(poolSettleMax)); !got.IsZero() {
		t.Fatalf("a claim poolSettleMax old (its create failed): the refill holds until %v, want no hold", got)
	}
	m.noteClaimed(claimed, now.Add(-poolSettleMax))
	if n := m.ClaimsStarting(); n != 0 {
		t.Fatalf("a claim poolSettleMax old counts as %d creates starting, want 0: the refill no longer waits for it", n)
	}

	for name, pool := range map[string]func() *Instances{
		"one left": func() *Instances { return newPool(t, 1) },
		"a create waits": func() *Instances {
			m := newPool(t, 2)
			m.waiting.Add(1)
			return m
		},
		"a burst": func() *Instances {
			m := newPool(t, 2)
			m.burstTarget = 6
			return m
		},
	} {
		m := pool()
		m.noteClaimed(claimed, now)
		if got := m.settleUntil(now); !got.IsZero() {
			t.Errorf("%s: the refill holds until %v for a claimed create, want no hold", name, got)
		}
	}
}
