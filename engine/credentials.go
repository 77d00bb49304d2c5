package engine

import (
	"context"
	"time"

	"dbcloud"
)

// Database credentials (decisions.md section 12) are login roles the
// runtime keeps equal to the live credentials of each service. The
// service layer syncs them when a request makes or revokes one; the
// engine syncs them where nobody asked: before a service serves after an
// ensure (a fork drops the roles its parent's data brought, a start drops
// what was revoked while it was stopped), and in a round that ends
// expired credentials, also those that expired while dbcloud was down.

// DefaultCredentialInterval is how often the round looks for expired and
// revoked credentials: well inside the 60 s within which an expired
// credential's sessions must end.
const DefaultCredentialInterval = 10 * time.Second

// ensureCredentials syncs a running service's credential roles after its
// ensure, under the reconcile's lease. A service that never had a
// credential and is no fork has no credential role to drop: skipped.
func (e *Engine) ensureCredentials(ctx context.Context, svc *dbcloud.Service) error {
	rt := dbcloud.CapabilitiesOf(e.Provisioner).Credentials
	if rt == nil {
		return nil
	}
	creds, err := e.credentials(ctx, svc.ProjectID, svc.ID)
	if err != nil || (len(creds) == 0 && svc.Fork == nil) {
		return err
	}
	return e.syncCredentials(ctx, rt, svc, creds)
}

// credentialLoop runs credentialRound every CredentialInterval.
func (e *Engine) credentialLoop(ctx context.Context, rt dbcloud.Credentials) {
	every(ctx, e.CredentialInterval, func() {
		if err := e.credentialRound(ctx, rt); err != nil && ctx.Err() == nil {
			e.Logger.Warn("credential round", "error", err)
		}
	})
}

// credentialRound drops the roles of every READY service's credentials
// that may no longer log in, each under the service's lease. A stopped
// service serves nobody; the ensure that starts it syncs first. The rows
// of a deleted service's credentials go with the service.
func (e *Engine) credentialRound(ctx context.Context, rt dbcloud.Credentials) error {
	all, err := e.credentials(ctx, "", "")
	if err != nil {
		return err
	}
	now := e.now()
	type key struct{ project, service string }
	stale := map[key]bool{}
	for _, c := range all {
		if !c.Live(now) {
			stale[key{c.ProjectID, c.ServiceID}] = true
		}
	}
	for k := range stale {
		svc, err := e.findService(ctx, k.project, k.service)
		if err != nil {
			return err
		}
		if svc == nil || svc.Status != dbcloud.StatusReady {
			continue
		}
		e.guard("credential sync", svc.ID, func() { e.expireCredentials(ctx, rt, svc) })
	}
	return nil
}

// expireCredentials syncs one service's roles under its lease, for the
// round.
func (e *Engine) expireCredentials(ctx context.Context, rt dbcloud.Credentials, svc *dbcloud.Service) {
	lctx, release, ok := e.claimLeased(ctx, svc.ID)
	if !ok {
		return // another worker has the service; the next round comes back
	}
	defer release()
	creds, err := e.credentials(lctx, svc.ProjectID, svc.ID)
	if err == nil {
		err = e.syncCredentials(lctx, rt, svc, creds)
	}
	if err != nil && ctx.Err() == nil {
		e.Logger.Warn("credential sync", "service", svc.ID, "error", err)
	}
}

// syncCredentials makes the service's roles the live credentials, then
// forgets the others: their roles are gone. An expiry is recorded as a
// finished operation (a revocation was recorded by its request).
func (e *Engine) syncCredentials(ctx context.Context, rt dbcloud.Credentials, svc *dbcloud.Service, creds []*dbcloud.Credential) error {
	now := e.now()
	if err := rt.SyncCredentials(ctx, svc, dbcloud.LiveRoles(creds, now)); err != nil {
		return err
	}
	return e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		for _, c := range creds {
			if c.Live(now) {
				continue
			}
			if err := tx.DeleteCredential(c.ProjectID, c.ServiceID, c.ID); err != nil {
				if dbcloud.IsNotFound(err) {
					continue // another plane forgot it first
				}
				return err
			}
			if c.Revoked != nil {
				continue
			}
			op := dbcloud.FinishedOperation(c.ProjectID, c.ServiceID, c.ID, dbcloud.OpExpireCredential,
				dbcloud.Requester{System: "dbcloud"}, e.now(), "")
			if err := tx.InsertOperation(op); err != nil {
				return err
			}
			e.Logger.Info("credential expired", "service", svc.ID, "credential", c.ID)
		}
		return nil
	})
}

// credentials lists the credentials of a service, a project ("") or all.
func (e *Engine) credentials(ctx context.Context, projectID, serviceID string) ([]*dbcloud.Credential, error) {
	var out []*dbcloud.Credential
	err := e.Store.View(ctx, func(tx dbcloud.Tx) error {
		var err error
		out, err = tx.ListCredentials(projectID, serviceID)
		return err
	})
	return out, err
}

// deleteCredentialsTx forgets a deleted service's credentials: their roles
// went with its data.
func deleteCredentialsTx(tx dbcloud.Tx, projectID, serviceID string) error {
	creds, err := tx.ListCredentials(projectID, serviceID)
	if err != nil {
		return err
	}
	for _, c := range creds {
		if err := tx.DeleteCredential(c.ProjectID, c.ServiceID, c.ID); err != nil && !dbcloud.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// findService reads a service; nil when it is gone.
func (e *Engine) findService(ctx context.Context, projectID, id string) (*dbcloud.Service, error) {
	return findOrNil(ctx, e, func(tx dbcloud.Tx) (*dbcloud.Service, error) { return tx.FindService(projectID, id) })
}
