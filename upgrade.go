package dbcloud

import (
	"context"
	"fmt"
)

// UpgradeMethod is how a service moves to a newer PostgreSQL major
// version (decisions.md section 11).
type UpgradeMethod string

// Upgrade methods. IN_PLACE is the one dbcloud offers so far; BLUE_GREEN
// and ROLLBACK are named by the contract and refused until they are built.
const (
	UpgradeInPlace  UpgradeMethod = "IN_PLACE"
	UpgradeBlueGrn  UpgradeMethod = "BLUE_GREEN"
	UpgradeRollback UpgradeMethod = "ROLLBACK"
)

// CodeVersionUnavailable is the 409 of an upgrade to a version that has
// no build of an extension the service uses.
const CodeVersionUnavailable = "VERSION_UNAVAILABLE"

// OpUpgradeService realises a major version upgrade.
const OpUpgradeService OperationType = "upgrade_service"

// EventUpgradeStep reports one step of an upgrade as it ends: Status
// names the step, Reason says what it did or why it failed, and
// OperationID is the upgrade's operation.
const EventUpgradeStep EventType = "service.upgrade_step"

// UpgradeStep is one step of an upgrade as the runtime reports it.
type UpgradeStep struct {
	// Name is the step: "rehearsal_check", "rehearsal_upgrade",
	// "snapshot", "stop", "pg_upgrade", "start", "rollback", ...
	Name string
	// Detail says what it did, or what failed.
	Detail string
}

// Upgrader is the optional capability of a runtime that upgrades a
// service's PostgreSQL major version in place. Without it an upgrade is
// refused with a 4xx that names the runtime.
type Upgrader interface {
	// UpgradeInPlace moves the service's data from svc.Spec.PGVersion to
	// svc.UpgradeTo: first a rehearsal on a throwaway copy, then, only if
	// that passes, the service itself, with a snapshot taken just before
	// as the way back. It returns the full version now running once the
	// primary serves on the new version; on any failure it returns once
	// the service serves again on its old version and data, with an
	// *UpgradeFailed saying what failed. Idempotent: called again after a
	// crash of dbcloud, it finishes the upgrade or starts it over from
	// what is on disk. step is told of each step as it ends.
	UpgradeInPlace(ctx context.Context, svc *Service, step func(UpgradeStep)) (full string, err error)
}

// UpgradeFailed is an upgrade that did not happen: the service is back
// on its old version and data, and Reason (a sentence a user may read)
// says which step failed and why.
type UpgradeFailed struct {
	Step   string
	Reason string
}

func (e *UpgradeFailed) Error() string {
	return fmt.Sprintf("upgrade failed at %s: %s", e.Step, e.Reason)
}
