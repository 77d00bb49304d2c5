package cloud

import (
	"context"
	"path"
	"reflect"

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
	if err := c.checkUpgradeMethod(in.Method); err != nil {
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
		if err := checkUpgradeTarget(s, target, c.Runtime.PGVersions()); err != nil {
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
		s.UpgradeTo = target.Major
		s.StatusReason = ""
		dbcloud.Upgrade.Apply(s)
		return dbcloud.OpUpgradeService, nil
	})
}

// checkUpgradeMethod refuses the methods dbcloud does not offer yet, and
// any upgrade on a runtime that cannot make one.
func (c *Cloud) checkUpgradeMethod(m dbcloud.UpgradeMethod) error {
	switch m {
	case "", dbcloud.UpgradeInPlace:
	case dbcloud.UpgradeBlueGrn, dbcloud.UpgradeRollback:
		return dbcloud.Errorf(dbcloud.KindInvalid, "method %s is not offered yet; upgrade with IN_PLACE.", m)
	default:
		return dbcloud.Errorf(dbcloud.KindInvalid, "method %q is not an upgrade method; use IN_PLACE.", m)
	}
	if dbcloud.CapabilitiesOf(c.Runtime).Upgrader == nil {
		return dbcloud.Errorf(dbcloud.KindConflict, "This installation's %s runtime does not upgrade services in place yet.", runtimeName(c.Runtime))
	}
	return nil
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
