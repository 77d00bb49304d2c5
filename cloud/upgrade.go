package cloud

import (
	"context"
	"path"
	"reflect"
	"strconv"
	"time"

	"dbcloud"
)

// UpgradeRequest is an upgradeService request (decisions.md section 11).
type UpgradeRequest struct {
	// PGVersion is the major version to move to; required.
	PGVersion *int
	// Method is IN_PLACE when empty.
	Method dbcloud.UpgradeMethod
}

// UpgradeService accepts a major version upgrade of a READY service: it
// shows UPGRADING, and the engine rehearses and makes the upgrade, leaving
// the service READY on the new version or, with the reason, on its old one.
func (c *Cloud) UpgradeService(ctx context.Context, projectID, id string, in UpgradeRequest) (*ServiceView, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	method := in.Method
	if method == "" {
		method = dbcloud.UpgradeInPlace
	}
	if err := c.checkUpgradeMethod(method); err != nil {
		return nil, err
	}
	if in.PGVersion == nil {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "pg_version is required; this installation runs PostgreSQL %s.",
			dbcloud.ListPGVersions(c.Runtime.PGVersions()))
	}
	target, err := dbcloud.ChoosePGVersion(in.PGVersion, c.Runtime.PGVersions())
	if err != nil {
		return nil, err
	}
	return c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if err := busy(tx, s); err != nil {
			return "", err
		}
		if err := dbcloud.Upgrade.Check(s); err != nil {
			return "", err
		}
		reason, err := c.checkMethodTarget(tx, s, method, target)
		if err != nil {
			return "", err
		}
		// A fork still being made reads this service's snapshots and
		// WAL, which the upgrade sets aside for the new version's.
		if f, err := copyingFork(tx, s); err != nil || f != nil {
			if err != nil {
				return "", err
			}
			return "", dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress,
				"Fork %s is still copying this service's data; upgrade it when the fork is READY.", f.ID)
		}
		s.UpgradeTo, s.UpgradeMethod = target.Major, method
		s.StatusReason = reason
		dbcloud.Upgrade.Apply(s)
		return dbcloud.OpUpgradeService, nil
	})
}

// checkUpgradeMethod refuses what is not an upgrade method, and a method
// the runtime cannot make.
func (c *Cloud) checkUpgradeMethod(m dbcloud.UpgradeMethod) error {
	caps := dbcloud.CapabilitiesOf(c.Runtime)
	switch m {
	case dbcloud.UpgradeInPlace:
		if caps.Upgrader == nil {
			return dbcloud.Errorf(dbcloud.KindConflict, "This installation's %s runtime does not upgrade services in place yet.", runtimeName(c.Runtime))
		}
	case dbcloud.UpgradeBlueGreen, dbcloud.UpgradeRollback:
		if caps.BlueGreen == nil {
			return dbcloud.Errorf(dbcloud.KindConflict, "This installation's %s runtime does not offer %s upgrades yet.", runtimeName(c.Runtime), m)
		}
	default:
		return dbcloud.Errorf(dbcloud.KindInvalid, "method %q is not an upgrade method; use IN_PLACE, BLUE_GREEN or ROLLBACK.", m)
	}
	return nil
}

// checkMethodTarget checks the target version against what the method
// can do for this service; it returns the status_reason the service
// shows while it upgrades (what a ROLLBACK loses).
func (c *Cloud) checkMethodTarget(tx dbcloud.Tx, s *dbcloud.Service, m dbcloud.UpgradeMethod, target dbcloud.PGVersion) (string, error) {
	if m == dbcloud.UpgradeRollback {
		return checkRollback(s, target, c.now())
	}
	if err := checkUpgradeTarget(s, target, c.Runtime.PGVersions()); err != nil {
		return "", err
	}
	if m == dbcloud.UpgradeBlueGreen {
		sets, err := tx.ListReplicaSets(s.ProjectID, s.ID)
		if err != nil {
			return "", err
		}
		return "", checkBlueGreen(s, len(sets))
	}
	return "", nil
}

// checkBlueGreen refuses what logical replication cannot carry to the new
// cluster: TimescaleDB's hypertables (their chunks replicate as plain
// tables, without the hypertable), and standbys, which would have to be
// made again from the new cluster while it is already serving.
func checkBlueGreen(s *dbcloud.Service, replicaSets int) error {
	for _, a := range s.Spec.Addons {
		if a.Extension() == "timescaledb" {
			return dbcloud.Errorf(dbcloud.KindConflict,
				"The service uses the extension timescaledb (addon %s): hypertables do not replicate logically, so BLUE_GREEN cannot move them. Upgrade it with IN_PLACE.", a)
		}
	}
	if s.Spec.Replicas > 0 {
		return dbcloud.Errorf(dbcloud.KindConflict,
			"The service has %d HA replicas, which BLUE_GREEN does not move. Upgrade it with IN_PLACE (its standbys follow), or remove the replicas first.", s.Spec.Replicas)
	}
	if replicaSets > 0 {
		return dbcloud.Errorf(dbcloud.KindConflict,
			"The service has %d read replica sets, which BLUE_GREEN does not move. Upgrade it with IN_PLACE (they are copied again), or delete them first.", replicaSets)
	}
	return nil
}

// checkRollback accepts a ROLLBACK to the version of the cluster a
// BLUE_GREEN switch kept, while it is kept; the reason it returns says
// what is lost.
func checkRollback(s *dbcloud.Service, target dbcloud.PGVersion, now time.Time) (string, error) {
	k := s.KeptCluster
	if k == nil {
		return "", dbcloud.Errorf(dbcloud.KindConflict,
			"The service has no old cluster to roll back to: ROLLBACK returns, within %d hours, to the cluster a BLUE_GREEN upgrade switched from.", int(dbcloud.KeepOldClusterFor.Hours()))
	}
	if !now.Before(k.Until) {
		return "", dbcloud.Errorf(dbcloud.KindConflict,
			"The PostgreSQL %d cluster this service switched from was kept until %s and is removed; ROLLBACK is no longer possible.", k.PGVersion, k.Until.UTC().Format(time.RFC3339))
	}
	if target.Major != k.PGVersion {
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "ROLLBACK returns to PostgreSQL %d, the version the service switched from; pg_version %d is not it.", k.PGVersion, target.Major)
	}
	return "Rolling back to the PostgreSQL " + strconv.Itoa(k.PGVersion) + " cluster as it was at the switch: what was written after the switch is lost.", nil
}

// checkUpgradeTarget refuses a version that is not newer than the
// service's (400, listing the newer ones) and one without a build of an
// extension the service's addons use (409 VERSION_UNAVAILABLE, naming it).
func checkUpgradeTarget(s *dbcloud.Service, target dbcloud.PGVersion, have []dbcloud.PGVersion) error {
	cur := s.Spec.PGVersion
	if cur == dbcloud.PGVersionUnknown {
		cur = 15 // every service recorded before versions runs 15 (pgversion.go)
	}
	if target.Major <= cur {
		var newer []dbcloud.PGVersion
		for _, v := range have {
			if v.Major > cur {
				newer = append(newer, v)
			}
		}
		if len(newer) == 0 {
			return dbcloud.Errorf(dbcloud.KindInvalid, "pg_version %d is not newer than the service's PostgreSQL %d, and this installation has no newer version.", target.Major, cur)
		}
		return dbcloud.Errorf(dbcloud.KindInvalid, "pg_version %d is not newer than the service's PostgreSQL %d; it can move to %s.",
			target.Major, cur, dbcloud.ListPGVersions(newer))
	}
	for _, a := range s.Spec.Addons {
		if ext := a.Extension(); !target.Extensions[ext] {
			return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeVersionUnavailable,
				"The service uses the extension %q (addon %s), which this installation has no build of for PostgreSQL %d.", ext, a, target.Major)
		}
	}
	return nil
}

// runtimeName names a runtime by its package, as operators choose it
// (--runtime local, kubernetes).
func runtimeName(rt any) string {
	t := reflect.TypeOf(rt)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.PkgPath() == "" {
		return "configured"
	}
	return path.Base(t.PkgPath())
}
