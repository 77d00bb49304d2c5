package dbcloud

import "context"

// AutoPause is a service's auto-pause setting (decisions.md section 10):
// with no client session on any of its endpoints and no operation pending
// for IdleSeconds, the service is paused; a connection wakes it.
type AutoPause struct {
	IdleSeconds int `json:"idle_seconds"`
}

// The bounds of idle_seconds: a minute to a week; 0 turns auto-pause off.
const (
	MinIdleSeconds = 60
	MaxIdleSeconds = 7 * 24 * 3600
)

// ParseIdleSeconds checks idle_seconds as a client gave it: nil for 0
// (auto-pause off), the setting otherwise.
func ParseIdleSeconds(n int) (*AutoPause, error) {
	if n == 0 {
		return nil, nil
	}
	if n < MinIdleSeconds || n > MaxIdleSeconds {
		return nil, Errorf(KindInvalid, "idle_seconds must be 0 (off) or between %d and %d, got %d.", MinIdleSeconds, MaxIdleSeconds, n)
	}
	return &AutoPause{IdleSeconds: n}, nil
}

// AutoPaused reports whether the service is paused by its idle clock, so
// that a connection wakes it; a service paused by stopService is not.
func (s *Service) AutoPaused() bool {
	return s.PausedAt != nil && !s.Spec.Running
}

// Operations dbcloud records by itself for auto-pause.
const (
	OpAutoPause OperationType = "auto_pause"
	OpWake      OperationType = "wake"
)

// Waker is the optional capability of a runtime that keeps the endpoints
// of an auto-paused service listening, holds a client that connects and
// asks for the service's wake through the handler it was given.
type Waker interface {
	// SetWakeHandler gives the runtime what it calls, once per wake, when
	// a client connects to an auto-paused service. A nil error means the
	// wake was recorded (the engine starts the service); an error is
	// what the held clients are told.
	SetWakeHandler(h WakeHandler)
	// HoldPaused keeps the endpoints of an auto-paused service listening;
	// idempotent. The engine calls it for every auto-paused service, which
	// also brings the listeners back after a restart of dbcloud.
	HoldPaused(ctx context.Context, svc *Service) error
}

// WakeHandler asks for the wake of a service of a project.
type WakeHandler func(ctx context.Context, projectID, serviceID string) error
