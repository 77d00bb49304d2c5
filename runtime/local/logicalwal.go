package local

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"dbcloud"
	"dbcloud/internal/atomicfile"
	"dbcloud/runtime/local/postgres"
)

// A BLUE_GREEN upgrade replicates logically from the old primary, which
// needs wal_level=logical, a setting PostgreSQL takes only at a start. A
// service on a version older than the host's newest (the services such an
// upgrade is for) is given it whenever its server starts anyway: at its
// creation, a resume, a wake; so that its upgrade restarts nothing
// before the switch. One that has run since before this, and not stopped
// since, is restarted into it once, by its first BLUE_GREEN upgrade. This
// file in the service's directory records either, so the setting never
// changes under a running server by itself (no restart when dbcloud is
// updated), and stays while the service is on an older version: the cost
// is a little more WAL for rows updated or deleted. Once the service is on
// the newest version, the file goes at a start of it from stopped.
const logicalWALFile = "wal_level_logical"

// logicalWAL reports whether the service's servers write logical WAL.
func (rt *Runtime) logicalWAL(serviceID string) bool {
	_, err := os.Stat(filepath.Join(rt.serviceDir(serviceID), logicalWALFile))
	return err == nil
}

// markLogicalWAL makes the service's servers write logical WAL from their
// next start.
func (rt *Runtime) markLogicalWAL(serviceID string) error {
	return atomicfile.Write(filepath.Join(rt.serviceDir(serviceID), logicalWALFile), nil, 0o600)
}

// logicalAtStart marks a service on an older version than the host's
// newest as writing logical WAL, and sets base so, when its primary is
// about to start: it is the primary alone on the endpoint (HA services
// only when they are made) and does not run. A service marked so that is
// on the newest version (upgraded since) loses the mark when none of its
// servers runs: its next start writes the WAL it needs and no more.
func (rt *Runtime) logicalAtStart(svc *dbcloud.Service, base *postgres.Spec) error {
	if len(rt.versions) == 0 || !svc.Spec.Running || svc.Spec.PGVersion == dbcloud.PGVersionUnknown {
		return nil
	}
	if svc.Spec.PGVersion >= rt.versions[len(rt.versions)-1].Major {
		return rt.unmarkLogicalWAL(svc, base)
	}
	if base.Settings["wal_level"] == "logical" {
		return nil
	}
	if _, err := os.Stat(rt.haPath(svc.ID)); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if _, running := rt.instances.Running(*base); running {
		return nil
	}
	if err := rt.markLogicalWAL(svc.ID); err != nil {
		return err
	}
	base.Settings["wal_level"] = "logical"
	return nil
}

// unmarkLogicalWAL removes the mark, and the setting from base, unless
// a server of the service runs: changed under it, the setting would
// restart it at its next ensure.
func (rt *Runtime) unmarkLogicalWAL(svc *dbcloud.Service, base *postgres.Spec) error {
	if !rt.logicalWAL(svc.ID) {
		return nil
	}
	ha, err := rt.loadHA(svc.ID)
	if err != nil {
		return err
	}
	running := []postgres.Spec{*base}
	if ha != nil {
		for _, n := range ha.Members {
			running = append(running, rt.haSpec(svc, *base, ha, n))
		}
	}
	for _, s := range running {
		if _, ok := rt.instances.Running(s); ok {
			return nil
		}
	}
	if err := os.Remove(filepath.Join(rt.serviceDir(svc.ID), logicalWALFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	delete(base.Settings, "wal_level")
	return nil
}
