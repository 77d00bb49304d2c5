package engine

import (
	"context"
	"errors"
	"fmt"

	"dbcloud"
)

// upgrade makes an accepted major version upgrade real before the
// service's ensure (decisions.md section 11). On success the service's
// spec names the new version and the caller's ensure and settle finish as
// for any change; done is false. When the runtime reports the upgrade
// failed (the service is back on its old version), upgrade itself ensures
// the service, shows it READY with the reason and fails the operation:
// done is true. Any other error is an attempt that failed, retried as
// every other: the runtime's upgrade starts over from what is on disk.
func (e *Engine) upgrade(ctx context.Context, svc *dbcloud.Service, ensure func() (*dbcloud.Observation, error)) (done bool, err error) {
	opID, pending, err := e.pendingUpgrade(ctx, svc.ID)
	if err != nil {
		return false, err
	}
	if !pending {
		// Superseded (a delete, a correction): nothing asks for it now.
		return false, e.updateService(ctx, svc, func(s *dbcloud.Service) bool {
			s.UpgradeTo, s.UpgradeMethod = 0, ""
			return true
		}, nil)
	}
	from, to, method := svc.Spec.PGVersion, svc.UpgradeTo, svc.UpgradeMethod
	run, refused := e.upgradeMethod(svc)
	if refused != nil {
		return true, e.upgradeFailed(ctx, svc, ensure, refused)
	}
	e.Logger.Info("upgrade", "service", svc.ID, "from", from, "to", to, "method", method, "operation", opID)
	full, err := run(ctx, svc, func(st dbcloud.UpgradeStep) { e.upgradeStep(ctx, svc, opID, st) })
	var failure *dbcloud.UpgradeFailed
	if errors.As(err, &failure) {
		e.Logger.Warn("upgrade failed; the service is back on its old version", "service", svc.ID, "from", from, "to", to, "step", failure.Step, "reason", failure.Reason)
		return true, e.upgradeFailed(ctx, svc, ensure, failure)
	}
	if err != nil {
		return true, failed(ctx, e, serviceKind, svc, err)
	}
	e.Logger.Info("upgraded", "service", svc.ID, "from", from, "to", to, "method", method, "pg_version_full", full)
	fromFull, now := svc.PGVersionFull, e.now()
	return false, e.updateService(ctx, svc, func(s *dbcloud.Service) bool {
		switch method {
		case dbcloud.UpgradeBlueGreen:
			s.KeptCluster = &dbcloud.KeptCluster{PGVersion: from, PGVersionFull: fromFull, Until: now.Add(dbcloud.KeepOldClusterFor)}
		case dbcloud.UpgradeRollback:
			s.KeptCluster = nil
		}
		s.Spec.PGVersion, s.PGVersionFull, s.UpgradeTo, s.UpgradeMethod = to, full, 0, ""
		return true
	}, nil)
}

// upgradeMethod is the runtime's call that makes the service's upgrade,
// or the *UpgradeFailed of a runtime that cannot make it.
func (e *Engine) upgradeMethod(svc *dbcloud.Service) (func(context.Context, *dbcloud.Service, func(dbcloud.UpgradeStep)) (string, error), *dbcloud.UpgradeFailed) {
	caps := dbcloud.CapabilitiesOf(e.Provisioner)
	switch svc.UpgradeMethod {
	case dbcloud.UpgradeBlueGreen, dbcloud.UpgradeRollback:
		if caps.BlueGreen == nil {
			return nil, &dbcloud.UpgradeFailed{Step: "accept", Reason: "this runtime does not make " + string(svc.UpgradeMethod) + " upgrades"}
		}
		if svc.UpgradeMethod == dbcloud.UpgradeRollback {
			return caps.BlueGreen.RollBackUpgrade, nil
		}
		return caps.BlueGreen.UpgradeBlueGreen, nil
	}
	if caps.Upgrader == nil {
		return nil, &dbcloud.UpgradeFailed{Step: "accept", Reason: "this runtime does not upgrade services in place"}
	}
	return caps.Upgrader.UpgradeInPlace, nil
}

// removeExpiredCluster removes the old cluster a BLUE_GREEN switch kept
// once its time is up, level-triggered: the service's record says it is
// kept until the runtime has removed it.
func (e *Engine) removeExpiredCluster(ctx context.Context, svc *dbcloud.Service) error {
	k := svc.KeptCluster
	if k == nil || e.now().Before(k.Until) || svc.UpgradeTo != 0 {
		return nil
	}
	bg := dbcloud.CapabilitiesOf(e.Provisioner).BlueGreen
	if bg != nil {
		if err := bg.RemoveKeptCluster(ctx, svc); err != nil {
			return err
		}
	}
	e.Logger.Info("old cluster removed: its time for a rollback is up", "service", svc.ID, "pg_version", k.PGVersion, "until", k.Until)
	return e.updateService(ctx, svc, func(s *dbcloud.Service) bool {
		s.KeptCluster = nil
		return true
	}, nil)
}

// pendingUpgrade finds the service's pending upgrade operation.
func (e *Engine) pendingUpgrade(ctx context.Context, id string) (opID string, ok bool, err error) {
	err = e.Store.View(ctx, func(tx dbcloud.Tx) error {
		ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: id, Pending: true})
		for _, op := range ops {
			if op.Type == dbcloud.OpUpgradeService {
				opID, ok = op.ID, true
			}
		}
		return err
	})
	return opID, ok, err
}

// upgradeFailed ensures the service on its old version and shows it
// READY with what failed, the upgrade's operation failed with the same
// reason. An ensure that fails is an attempt that failed, as any.
func (e *Engine) upgradeFailed(ctx context.Context, svc *dbcloud.Service, ensure func() (*dbcloud.Observation, error), failure *dbcloud.UpgradeFailed) error {
	to := svc.UpgradeTo
	if err := e.updateService(ctx, svc, func(s *dbcloud.Service) bool {
		s.UpgradeTo, s.UpgradeMethod = 0, ""
		return true
	}, nil); err != nil {
		return err
	}
	obs, err := ensure()
	if err != nil {
		return failed(ctx, e, serviceKind, svc, err)
	}
	reason := fmt.Sprintf("The upgrade to PostgreSQL %d failed (%s): %s. The service runs PostgreSQL %d with its data as before.",
		to, failure.Step, failure.Reason, svc.Spec.PGVersion)
	gen := svc.Generation
	return e.updateService(ctx, svc, func(s *dbcloud.Service) bool {
		s.Instances = obs.Instances
		if s.Generation == gen && s.Status != dbcloud.StatusDeleting {
			settleStatus(s, obs)
			if s.Status == dbcloud.StatusReady {
				s.StatusReason = reason
			}
		}
		return true
	}, func(tx dbcloud.Tx) error {
		return finishOperationsTx(tx, svc.ID, gen, dbcloud.OpFailed, reason, e.now())
	})
}

// upgradeStep records one step of an upgrade as an event of its
// operation. A step that cannot be recorded is logged, not fatal: the
// upgrade's outcome is recorded by its operation either way.
func (e *Engine) upgradeStep(ctx context.Context, svc *dbcloud.Service, opID string, st dbcloud.UpgradeStep) {
	e.Logger.Info("upgrade step", "service", svc.ID, "step", st.Name, "detail", st.Detail)
	err := e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		return tx.InsertEvent(&dbcloud.Event{ProjectID: svc.ProjectID, Type: dbcloud.EventUpgradeStep, ResourceKind: "service",
			ResourceID: svc.ID, Status: st.Name, Reason: st.Detail, OperationID: opID, OperationType: dbcloud.OpUpgradeService})
	})
	if err != nil && ctx.Err() == nil {
		e.Logger.Warn("record upgrade step", "service", svc.ID, "step", st.Name, "error", err)
	}
}
