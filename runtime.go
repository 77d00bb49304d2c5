package dbcloud

import (
	"context"
	"time"
)

// The runtime contract, declared once. Every runtime (runtime/local,
// runtime/kubernetes) implements Runtime, which the service layer asks
// while answering a request, and Provisioner, which the engine calls to
// make desired state real. What only some runtimes can do is an optional
// capability below, each a named interface; CapabilitiesOf is the one
// place that asks a runtime which of them it has. VPCs are the Network's
// (network.go), wired beside the runtime.

// Runtime is what the domain asks of the runtime while answering a request.
// Everything slow or fallible goes through operations and the engine instead.
type Runtime interface {
	// PGVersions lists the PostgreSQL major versions services can run on,
	// oldest first, each with the extensions it can create; a create
	// chooses one (decisions.md section 11).
	PGVersions() []PGVersion
	// PortFree reports whether nothing else on the host holds the port.
	PortFree(port int) bool
	// SetPassword makes verifier the password of tsdbadmin on the running
	// service; it returns once the new password works.
	SetPassword(ctx context.Context, svc *Service, verifier string) error
	// Logs reads a page of the service's log lines.
	Logs(ctx context.Context, svc *Service, q LogQuery) (*LogPage, error)
}

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

// Backups is implemented by runtimes that keep snapshots (base backups) and
// a continuous WAL archive per service, which is what forks restore from.
// The domain asks it while answering a fork request, so it must be cheap:
// it reads what the runtime already has and never takes a snapshot.
type Backups interface {
	// RecoveryWindow reports what a fork of the service can restore.
	RecoveryWindow(ctx context.Context, svc *Service) (RecoveryWindow, error)
}

// BackupMaintainer is implemented by provisioners that take snapshots on a
// schedule and prune old snapshots and WAL. The engine calls it for each
// READY service, often; it does nothing when nothing is due.
type BackupMaintainer interface {
	MaintainBackups(ctx context.Context, svc *Service) error
}

// SnapshotLister is implemented by runtimes that keep snapshots; like
// Backups, it only reads what the runtime has.
type SnapshotLister interface {
	// Snapshots lists the service's complete snapshots, oldest first.
	Snapshots(ctx context.Context, svc *Service) ([]SnapshotInfo, error)
}

// RestoreChecker is implemented by runtimes that verify their restores.
type RestoreChecker interface {
	// LastRestoreCheck is the service's last verified restore; nil when
	// none ran yet.
	LastRestoreCheck(svc *Service) (*RestoreCheck, error)
}

// Capacity is implemented by a runtime that can tell what its host holds.
// It is asked before a store transaction, never inside one.
type Capacity interface {
	// HostCapacity reports what the host has now.
	HostCapacity() (HostCapacity, error)
}

// Capabilities are the optional parts of a runtime; a nil field is a
// capability the runtime lacks.
type Capabilities struct {
	// ReplicaSets runs read replica sets; without it their operations wait.
	ReplicaSets ReplicaSetProvisioner
	// Backups answers what a fork can restore; without it forks are
	// accepted without checking the parent's recovery window.
	Backups Backups
	// Maintainer takes scheduled snapshots and prunes old ones.
	Maintainer BackupMaintainer
	// Snapshots lists a service's snapshots.
	Snapshots SnapshotLister
	// RestoreChecks reports the last verified restore of a service.
	RestoreChecks RestoreChecker
	// Capacity reports what the host holds, for admission; without it
	// only project quotas bound what is admitted.
	Capacity Capacity
	// Credentials makes database credentials; without it their requests
	// are refused.
	Credentials Credentials
	// Failures tells the engine of a failure as it happens; without it
	// failures are found by the health loop's next check.
	Failures FailureWatcher
	// Waker holds the endpoints of auto-paused services and wakes them
	// on a connection; without it auto-paused services wake only by
	// startService.
	Waker Waker
	// Upgrader upgrades a service's PostgreSQL major version in place;
	// without it upgrades are refused.
	Upgrader Upgrader
	// BlueGreen upgrades onto a new cluster and rolls back to the old
	// one; without it BLUE_GREEN and ROLLBACK are refused.
	BlueGreen BlueGreenUpgrader
	// PasswordBudget is how long the runtime's SetPassword may take
	// before updatePassword answers 409; without it the service layer's
	// default applies.
	PasswordBudget PasswordBudgeter
}

// PasswordBudgeter is implemented by runtimes that know how long their
// password change takes to be applied: milliseconds on the host, seconds
// through an operator's controllers.
type PasswordBudgeter interface {
	PasswordBudget() time.Duration
}

// CapabilitiesOf reports the optional capabilities of rt.
func CapabilitiesOf(rt any) Capabilities {
	var c Capabilities
	c.ReplicaSets, _ = rt.(ReplicaSetProvisioner)
	c.Backups, _ = rt.(Backups)
	c.Maintainer, _ = rt.(BackupMaintainer)
	c.Snapshots, _ = rt.(SnapshotLister)
	c.RestoreChecks, _ = rt.(RestoreChecker)
	c.Capacity, _ = rt.(Capacity)
	c.Credentials, _ = rt.(Credentials)
	c.Failures, _ = rt.(FailureWatcher)
	c.Waker, _ = rt.(Waker)
	c.Upgrader, _ = rt.(Upgrader)
	c.BlueGreen, _ = rt.(BlueGreenUpgrader)
	c.PasswordBudget, _ = rt.(PasswordBudgeter)
	return c
}

// FailureWatcher is implemented by runtimes that see a service fail as it
// happens (its primary's process exits) rather than at the next health
// check: a failover then starts from the failure, not from a tick.
type FailureWatcher interface {
	// WatchFailures makes the runtime call notify with the service's
	// project and ID when it sees the service fail. notify must not
	// block; what it starts checks the service as a health check would.
	WatchFailures(notify func(projectID, serviceID string))
}

// CredentialRole is a database credential as the runtime makes it: a
// login role of its own on the service (decisions.md section 12).
type CredentialRole struct {
	// Username is the role's name: CredentialUsername of the credential.
	Username string
	// Verifier is the SCRAM-SHA-256 verifier of its password.
	Verifier string
	// ReadOnly makes every session of the role read-only whatever it
	// sets; otherwise the role acts with tsdbadmin's privileges.
	ReadOnly bool
	// Expires is when the role stops being able to log in.
	Expires time.Time
}

// Credentials is implemented by runtimes that make database credentials.
// The service layer calls SyncCredentials after it records a change, and
// the engine calls it on a round, so expiries happen also when dbcloud was
// down at the moment.
type Credentials interface {
	// SyncCredentials makes the service's credential roles exactly live:
	// each one exists with its verifier, access and expiry; every other
	// credential role (revoked, expired, or inherited by a fork from its
	// parent) has its sessions ended on every instance and is dropped,
	// what it owned passing to tsdbadmin. It returns once that holds.
	SyncCredentials(ctx context.Context, svc *Service, live []CredentialRole) error
	// CredentialLogins reports when each credential role last logged in,
	// from the server's own connection records; a role never seen is
	// absent.
	CredentialLogins(ctx context.Context, svc *Service) (map[string]time.Time, error)
}
