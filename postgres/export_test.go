package postgres

import (
	"context"
	"time"
)

// OpenFollowingVia is Open with the follower's connection (the one that
// listens) made to followDSN, the same database as dsn by another way:
// through a proxy that a test can stall, while the plane's pool and
// sender keep their own way to the database.
func OpenFollowingVia(ctx context.Context, dsn, followDSN string) (*Store, error) {
	return open(ctx, dsn, followDSN)
}

// FollowerPID returns the server process of s's follower connection (0
// before it first connected), so that a test can find or end it.
func FollowerPID(s *Store) int { return int(s.follow.pid.Load()) }

// Settled reports whether s's writers no longer wait for planes that may
// have spoken before its follower listened (planes.covered), so that a
// benchmark measures the steady state.
func Settled(s *Store) bool {
	p := s.planes
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.listening.IsZero() && time.Now().After(p.listening.Add(leaseTTL+clockSlack))
}

// PlaneID returns the name s goes by among the planes.
func PlaneID(s *Store) string { return s.planes.id }

// Awaits reports whether a write on s would now wait for the ack of the
// plane named plane: s heard from it within its lease (planes.covered).
func Awaits(s *Store, plane string) bool {
	p := s.planes
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.heard[plane]
	return ok && time.Now().Before(h.at.Add(leaseTTL+clockSlack))
}
