package cloud

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"time"

	"dbcloud"
	"dbcloud/identity"
)

// CredentialCreate asks for a database credential (decisions.md section
// 12). Access "" is READ_ONLY; TTLSeconds 0 is the default.
type CredentialCreate struct {
	Name       string
	Access     string
	TTLSeconds int64
}

// NewCredential is a credential as made: the only answer that holds its
// password.
type NewCredential struct {
	*dbcloud.Credential
	Password         string
	ConnectionString string
}

// CredentialView is a credential as listed, with when its role last
// logged in (nil: never, or not known because the service is not READY).
type CredentialView struct {
	*dbcloud.Credential
	LastLogin *time.Time
}

// credentialsTimeout bounds the last-login lookup of a list: the list
// answers without it rather than wait for a busy service.
const credentialsTimeout = 2 * time.Second

// accessAction is the role table's action for making or revoking a
// credential of this access: a viewer may hand out what it can read.
func accessAction(a dbcloud.CredentialAccess) identity.Action {
	if a == dbcloud.CredentialReadOnly {
		return identity.MintReadOnly
	}
	return identity.ChangeResources
}

// credentialRuntime is the runtime's credential capability, or a refusal
// when it has none.
func (c *Cloud) credentialRuntime() (dbcloud.Credentials, error) {
	rt := dbcloud.CapabilitiesOf(c.Runtime).Credentials
	if rt == nil {
		return nil, dbcloud.Errorf(dbcloud.KindConflict, "This installation's runtime does not make database credentials.")
	}
	return rt, nil
}

// CreateCredential makes a database credential for the service: a login
// role of its own that works when this returns and stops at its expiry.
// The role is made under the service's lease, after the credential is
// recorded, so a crash in between leaves a recorded credential that the
// engine's round makes or, once expired, removes: never a role nobody
// knows of.
func (c *Cloud) CreateCredential(ctx context.Context, projectID, serviceID string, in CredentialCreate) (*NewCredential, error) {
	access := dbcloud.CredentialReadOnly
	if in.Access != "" {
		var err error
		if access, err = dbcloud.ParseCredentialAccess(in.Access); err != nil {
			return nil, err
		}
	}
	action := accessAction(access)
	if _, err := c.authorizeTo(ctx, projectID, action); err != nil {
		return nil, err
	}
	name, err := dbcloud.NormalName("name", in.Name)
	if err != nil {
		return nil, err
	}
	ttl, err := dbcloud.CredentialTTL(in.TTLSeconds)
	if err != nil {
		return nil, err
	}
	rt, err := c.credentialRuntime()
	if err != nil {
		return nil, err
	}
	password := dbcloud.NewPassword()
	now := c.now()
	cred := &dbcloud.Credential{ID: dbcloud.NewID(), ProjectID: projectID, ServiceID: serviceID, Name: name, Access: access,
		Verifier: dbcloud.NewSCRAMVerifier(password), Created: now, Expires: now.Add(ttl), CreatedBy: requesterOf(ctx)}
	const notDone = "no credential was made"
	var svc *dbcloud.Service
	err = c.underLease(ctx, projectID, serviceID, dbcloud.CreateCredential, notDone, func(actx context.Context, s *dbcloud.Service) error {
		svc = s
		if err := c.updateAs(ctx, projectID, action, func(tx dbcloud.Tx) error { return tx.InsertCredential(cred) }); err != nil {
			return err
		}
		serr := c.tenantWork(ctx, actx, s, notDone, func() error { return c.syncCredentials(actx, rt, s) })
		return c.recordCredential(ctx, action, cred, dbcloud.OpCreateCredential, serr)
	})
	if err != nil {
		return nil, err
	}
	claim(ctx, "credential", cred.ID)
	return &NewCredential{Credential: cred, Password: password, ConnectionString: connectionString(svc.Endpoint, cred.Username(), password)}, nil
}

// recordCredential records the end of a credential's synchronous work as a
// finished operation; a failed create also revokes the credential, so
// the engine removes whatever part of its role was made.
func (c *Cloud) recordCredential(ctx context.Context, action identity.Action, cred *dbcloud.Credential, t dbcloud.OperationType, failure error) error {
	reason := ""
	if failure != nil {
		reason = failure.Error()
	}
	// The request's first write recorded its idempotency claim; this one
	// must not again, and it must land even when the caller has gone.
	rctx := withoutIdempotency(context.WithoutCancel(ctx))
	err := c.updateAs(rctx, cred.ProjectID, action, func(tx dbcloud.Tx) error {
		if failure != nil && t == dbcloud.OpCreateCredential {
			now := c.now()
			cred.Revoked = &now
			if err := tx.UpdateCredential(cred); err != nil {
				return err
			}
		}
		op := dbcloud.FinishedOperation(cred.ProjectID, cred.ServiceID, cred.ID, t, requesterOf(ctx), c.now(), reason)
		if err := tx.InsertOperation(op); err != nil {
			return err
		}
		logOperation(ctx, op)
		return nil
	})
	if failure != nil {
		return failure
	}
	return err
}

// syncCredentials makes the service's credential roles the live ones as
// the store has them now.
func (c *Cloud) syncCredentials(ctx context.Context, rt dbcloud.Credentials, svc *dbcloud.Service) error {
	var creds []*dbcloud.Credential
	err := c.Store.View(ctx, func(tx dbcloud.Tx) error {
		var err error
		creds, err = tx.ListCredentials(svc.ProjectID, svc.ID)
		return err
	})
	if err != nil {
		return err
	}
	return rt.SyncCredentials(ctx, svc, dbcloud.LiveRoles(creds, c.now()))
}

// ListCredentials lists the service's credentials that may log in, with
// their last logins; never a password.
func (c *Cloud) ListCredentials(ctx context.Context, projectID, serviceID string) ([]*CredentialView, error) {
	var svc *dbcloud.Service
	var creds []*dbcloud.Credential
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) error {
		var err error
		if svc, err = findService(tx, projectID, serviceID); err != nil {
			return err
		}
		creds, err = tx.ListCredentials(projectID, serviceID)
		return err
	})
	if err != nil {
		return nil, err
	}
	logins := c.lastLogins(ctx, svc)
	now := c.now()
	out := []*CredentialView{}
	for _, cr := range creds {
		if !cr.Live(now) {
			continue
		}
		v := &CredentialView{Credential: cr}
		if t, ok := logins[cr.Username()]; ok {
			v.LastLogin = &t
		}
		out = append(out, v)
	}
	return out, nil
}

// lastLogins asks the runtime when each credential role last logged in,
// briefly and only of a READY service: the list answers without it.
func (c *Cloud) lastLogins(ctx context.Context, svc *dbcloud.Service) map[string]time.Time {
	rt := dbcloud.CapabilitiesOf(c.Runtime).Credentials
	if rt == nil || svc.Status != dbcloud.StatusReady {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, credentialsTimeout)
	defer cancel()
	logins, err := rt.CredentialLogins(lctx, svc)
	if err != nil {
		c.Logger.Warn("credential logins", "service", svc.ID, "error", err)
		return nil
	}
	return logins
}

// RevokeCredential ends a credential: on a READY service its role can no
// longer log in and its sessions have ended when this returns; on any
// other the revocation is recorded and the engine drops the role before
// the service serves again. Revoking a revoked credential whose role is
// not gone yet tries again.
func (c *Cloud) RevokeCredential(ctx context.Context, projectID, serviceID, id string) error {
	var cred *dbcloud.Credential
	var svc *dbcloud.Service
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) error {
		var err error
		if svc, err = findService(tx, projectID, serviceID); err != nil {
			return err
		}
		cred, err = tx.FindCredential(projectID, serviceID, id)
		if dbcloud.IsNotFound(err) {
			return dbcloud.Errorf(dbcloud.KindNotFound, "Credential %q not found.", id)
		}
		return err
	})
	if err != nil {
		return err
	}
	action := accessAction(cred.Access)
	if _, err := c.authorizeTo(ctx, projectID, action); err != nil {
		return err
	}
	if cred.Revoked == nil {
		err := c.updateAs(ctx, projectID, action, func(tx dbcloud.Tx) error {
			cur, err := tx.FindCredential(projectID, serviceID, id)
			if err != nil {
				return err
			}
			if cur.Revoked != nil {
				return nil
			}
			now := c.now()
			cur.Revoked = &now
			if err := tx.UpdateCredential(cur); err != nil {
				return err
			}
			op := dbcloud.FinishedOperation(projectID, serviceID, id, dbcloud.OpRevokeCredential, requesterOf(ctx), now, "")
			if err := tx.InsertOperation(op); err != nil {
				return err
			}
			logOperation(ctx, op)
			return nil
		})
		if err != nil {
			return err
		}
	}
	rt, err := c.credentialRuntime()
	if err != nil || !dbcloud.RevokeCredential.Allows(svc.Status) {
		return nil // recorded; the engine drops the role before the service serves
	}
	const notDone = "the credential is revoked and its role is dropped within a minute"
	return c.underLease(ctx, projectID, serviceID, dbcloud.RevokeCredential, notDone, func(actx context.Context, s *dbcloud.Service) error {
		return c.tenantWork(ctx, actx, s, notDone, func() error { return c.syncCredentials(actx, rt, s) })
	})
}

// connectionString is what psql and drivers take for a credential.
func connectionString(ep *dbcloud.Endpoint, user, password string) string {
	if ep == nil {
		return ""
	}
	u := url.URL{Scheme: "postgresql", User: url.UserPassword(user, password),
		Host: net.JoinHostPort(ep.Host, strconv.Itoa(ep.Port)), Path: "/tsdb", RawQuery: "sslmode=require"}
	return u.String()
}
