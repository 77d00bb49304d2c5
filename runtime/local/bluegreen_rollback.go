package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"dbcloud"
	"dbcloud/runtime/local/backup"
)

// After a BLUE_GREEN switch (bluegreen.go) the old cluster is kept for the
// rollback window: a rollback puts the endpoint back on it, and the end of
// the window removes it.

// RollBackUpgrade returns the service to the cluster a BLUE_GREEN switch
// kept. See dbcloud.BlueGreenUpgrader.
func (rt *Runtime) RollBackUpgrade(ctx context.Context, svc *dbcloud.Service, step func(dbcloud.UpgradeStep)) (string, error) {
	st, err := rt.loadBG(svc.ID)
	if err != nil {
		return "", err
	}
	if st == nil || (st.Phase != bgKept && st.Phase != bgRolling) || st.From != svc.UpgradeTo {
		return "", &dbcloud.UpgradeFailed{Step: "rollback", Reason: "the old cluster is no longer on this host"}
	}
	b, err := rt.newBG(ctx, svc, st.To, st.From, step)
	if err != nil {
		return "", err
	}
	ha, err := rt.loadHA(svc.ID)
	if err != nil || ha == nil {
		return "", fmt.Errorf("rollback of %s: no HA state: %w", svc.ID, err)
	}
	blue, green := b.blueSpec(ha, st, false), b.greenSpec(ha, st, true)
	if st.Phase == bgKept {
		if _, err := dataVersion(blue.PGData()); err != nil {
			return "", &dbcloud.UpgradeFailed{Step: "rollback", Reason: "the old cluster is no longer on this host"}
		}
		st.Phase = bgRolling
		if err := rt.saveBG(svc.ID, st); err != nil {
			return "", err
		}
	}
	if err := rt.stopPooler(ctx, svc.ID); err != nil {
		return "", err
	}
	rt.unwatchPrimary(svc.ID)
	if err := rt.pauseProxy(ctx, svc.ID, b.base.Owner, rt.proxyListen(svc), b.target(green)); err != nil {
		return "", err
	}
	if err := rt.stopInstance(ctx, green, 60*time.Second); err != nil {
		return "", err
	}
	b.done("stop", "the PostgreSQL "+strconv.Itoa(st.To)+" cluster is stopped; what was written to it is dropped")
	if !st.RolledBack {
		if err := b.swapArchives(st, st.To, rt.archiveDir(svc.ID)+"-pg"+strconv.Itoa(st.From)); err != nil {
			return "", err
		}
		if err := swapAside(backup.SnapshotsDir(rt.serviceDir(svc.ID)), st.To, st.From); err != nil {
			return "", err
		}
		st.RolledBack = true
		if err := rt.saveBG(svc.ID, st); err != nil {
			return "", err
		}
	}
	ha.Primary, ha.Members, ha.Logical = st.Blue, []int{st.Blue}, false
	if err := rt.saveHA(svc.ID, ha); err != nil {
		return "", err
	}
	if err := rt.instances.Ensure(ctx, blue); err != nil {
		return "", err
	}
	if err := rt.setProxy(ctx, svc.ID, b.base.Owner, rt.proxyListen(svc), b.target(blue)); err != nil {
		return "", err
	}
	b.done("switch", "the endpoint serves PostgreSQL "+b.to.Full+" again, with the data it had at the switch")
	if err := os.RemoveAll(green.Dir); err != nil {
		return "", err
	}
	_ = os.RemoveAll(rt.archiveDir(svc.ID) + "-pg" + strconv.Itoa(st.To))
	_ = os.RemoveAll(backup.SnapshotsDir(rt.serviceDir(svc.ID)) + "-pg" + strconv.Itoa(st.To))
	delete(ha.Ports, st.Green)
	if err := rt.saveHA(svc.ID, ha); err != nil {
		return "", err
	}
	if err := os.Remove(rt.bgPath(svc.ID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return b.to.Full, nil
}

// RemoveKeptCluster removes the cluster a BLUE_GREEN switch kept, with
// its archive and snapshots. See dbcloud.BlueGreenUpgrader.
func (rt *Runtime) RemoveKeptCluster(ctx context.Context, svc *dbcloud.Service) error {
	st, err := rt.loadBG(svc.ID)
	if err != nil || st == nil || st.Phase != bgKept {
		return err
	}
	dir := filepath.Join(rt.serviceDir(svc.ID), strconv.Itoa(st.Blue))
	ha, err := rt.loadHA(svc.ID)
	if err != nil {
		return err
	}
	if ha != nil && ha.Primary == st.Blue {
		return fmt.Errorf("kept cluster of %s is its primary", svc.ID)
	}
	base, err := rt.instanceBase(svc)
	if err != nil {
		return err
	}
	blue := base
	blue.ID, blue.Dir, blue.BinDir = svc.ID+"-"+strconv.Itoa(st.Blue), dir, rt.binDirs[st.From]
	if err := rt.stopInstance(ctx, blue, 30*time.Second); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	_ = os.RemoveAll(rt.archiveDir(svc.ID) + "-pg" + strconv.Itoa(st.From))
	_ = os.RemoveAll(backup.SnapshotsDir(rt.serviceDir(svc.ID)) + "-pg" + strconv.Itoa(st.From))
	if ha != nil {
		delete(ha.Ports, st.Blue)
		if err := rt.saveHA(svc.ID, ha); err != nil {
			return err
		}
	}
	rt.cfg.Logger.Info("kept cluster removed", "service", svc.ID, "pg_version", st.From)
	return os.Remove(rt.bgPath(svc.ID))
}
