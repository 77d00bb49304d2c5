package postgres

import "time"

// FollowerPID returns the server process of s's follower connection (0
// before it first connected), so that a test can stall it.
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
