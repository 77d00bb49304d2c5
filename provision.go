package dbcloud

import (
	"errors"
	"time"
)

// Observation is what the runtime saw of a service.
type Observation struct {
	// Running is true when the primary accepts connections.
	Running   bool
	Instances []Instance
	Metrics   *Metrics
	// Endpoint, when not nil, is where the service accepts connections as
	// the runtime assigned it (a Kubernetes load balancer's address),
	// replacing the one claimed at creation.
	Endpoint *Endpoint
	// PoolerEndpoint is where the service's connection pooler accepts
	// connections; nil when it has none or it does not run.
	PoolerEndpoint *Endpoint
	// Reason says what is wrong when the service is not as asked.
	Reason string
	// Sessions counts the client sessions on the service's endpoints
	// (its own, its pooler's, its VPC address), for the idle clock of a
	// service with auto-pause; nil when the runtime did not count them
	// (then the service is never taken for idle).
	Sessions *int
	// Notice says what a running service's user should know (it is near
	// its storage limit): its status_reason while READY.
	Notice string
}

// TerminalError marks a failure that retrying cannot fix; the engine fails
// the operation at once instead of backing off.
type TerminalError struct{ Err error }

func (e *TerminalError) Error() string { return e.Err.Error() }
func (e *TerminalError) Unwrap() error { return e.Err }

// Terminal wraps err as terminal.
func Terminal(err error) error { return &TerminalError{Err: err} }

// IsTerminal reports whether err is terminal.
func IsTerminal(err error) bool {
	var t *TerminalError
	return errors.As(err, &t)
}

// Lease is a claim on a resource: while it holds, no other control-plane
// process works on that resource.
type Lease struct {
	ResourceID string    `json:"resource_id"`
	Owner      string    `json:"owner"`
	Expires    time.Time `json:"expires"`
}
