package dbcloud

import (
	"context"
	"errors"
	"time"
)

// Provisioner makes desired state real; the engine calls it, never a
// request handler. Every method is idempotent: the engine may call it again
// after a crash, a timeout or a lost lease, and it then converges on the
// same result.
type Provisioner interface {
	// EnsureService makes the service's instances match its spec (running or
	// stopped, size, password, addons) and reports what it observed.
	EnsureService(ctx context.Context, svc *Service) (*Observation, error)
	// DeleteService removes every process and file of the service.
	DeleteService(ctx context.Context, svc *Service) error
	// CheckService reports health without changing anything, and usage
	// when measure is set (measuring may walk the data directory, so the
	// engine asks for it less often than it checks health).
	CheckService(ctx context.Context, svc *Service, measure bool) (*Observation, error)
}

// ReplicaSetProvisioner is implemented by a provisioner that runs read
// replica sets: hot standbys of a service's primary behind one endpoint.
// Without it, replica set operations wait. Every method is idempotent, as
// Provisioner's are; parent is the set's service as stored now (its
// primary may have moved since the set was last ensured).
type ReplicaSetProvisioner interface {
	// EnsureReplicaSet makes the set's nodes, endpoint and pooler match
	// its spec, following the parent's current primary.
	EnsureReplicaSet(ctx context.Context, parent *Service, set *ReadReplicaSet) (*Observation, error)
	// DeleteReplicaSet removes every process and file of the set and its
	// replication slots on the parent.
	DeleteReplicaSet(ctx context.Context, parent *Service, set *ReadReplicaSet) error
	// CheckReplicaSet reports health without changing anything; Running
	// is true when every node, the endpoint and the pooler serve and the
	// nodes follow the parent's current primary.
	CheckReplicaSet(ctx context.Context, parent *Service, set *ReadReplicaSet) (*Observation, error)
}

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
