package postgres

import (
	"log/slog"
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
