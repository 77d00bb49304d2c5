package dbcloud

import (
	"context"
	"fmt"
	"time"
)

// UpgradeMethod is how a service moves to a newer PostgreSQL major
// version (decisions.md section 11).
type UpgradeMethod string

// Upgrade methods: ROLLBACK returns to the cluster a BLUE_GREEN switch
// left stopped (KeptCluster).
const (
	UpgradeInPlace   UpgradeMethod = "IN_PLACE"
	UpgradeBlueGreen UpgradeMethod = "BLUE_GREEN"
	UpgradeRollback  UpgradeMethod = "ROLLBACK"
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

// KeepOldClusterFor is how long a BLUE_GREEN upgrade keeps the old
// cluster, stopped, as the way back (ROLLBACK).
const KeepOldClusterFor = 24 * time.Hour

// KeptCluster is the old cluster a BLUE_GREEN switch left stopped: a
// ROLLBACK to PGVersion before Until returns to it, with its data as it
// was at the switch.
type KeptCluster struct {
	PGVersion     int       `json:"pg_version"`
	PGVersionFull string    `json:"pg_version_full,omitempty"`
	Until         time.Time `json:"until"`
}

// BlueGreenUpgrader is the optional capability of a runtime that upgrades
// a service's major version onto a new cluster filled by logical
// replication, and goes back to the old one. Without it BLUE_GREEN and
// ROLLBACK are refused with a 4xx that names the runtime.
type BlueGreenUpgrader interface {
	// UpgradeBlueGreen makes a cluster on svc.UpgradeTo beside the
	// service, fills it by logical replication, and switches the
	// endpoint to it with writes paused until it has every acknowledged
	// one; the old cluster is left stopped. It returns the full version
	// now running; on a failure before the switch the service serves
	// on its old cluster again and the error is an *UpgradeFailed.
	// Idempotent: after a crash of dbcloud it finishes a switch that was
	// made, or undoes one that was not and starts over.
	UpgradeBlueGreen(ctx context.Context, svc *Service, step func(UpgradeStep)) (full string, err error)
	// RollBackUpgrade returns the service to its kept old cluster
	// (svc.KeptCluster), dropping what the new one holds. Idempotent.
	RollBackUpgrade(ctx context.Context, svc *Service, step func(UpgradeStep)) (full string, err error)
	// RemoveKeptCluster removes the old cluster a switch kept; idempotent.
	RemoveKeptCluster(ctx context.Context, svc *Service) error
}
