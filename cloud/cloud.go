package cloud

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"dbcloud"
	"dbcloud/history"

	"dbcloud/identity"
)

// Quotas bound what one project may hold (decisions.md section 3).
type Quotas struct {
	Services              int
	VPCs                  int
	PeeringsPerVPC        int
	ReplicaSetsPerService int
	MaxReplicaSetNodes    int
	MaxHAReplicas         int
	// OwnedProjects is how many projects one person may own after
	// creating them in the console (0: only the operator makes projects).
	OwnedProjects int
	// Resources is the compute and storage a project may reserve unless
	// it has its own quota (dbcloud admin project set-quota).
	Resources dbcloud.ResourceQuota
}

// DefaultQuotas are the documented defaults.
var DefaultQuotas = Quotas{
	Services:              100,
	VPCs:                  10,
	PeeringsPerVPC:        20,
	ReplicaSetsPerService: 5,
	MaxReplicaSetNodes:    10,
	MaxHAReplicas:         2,
	OwnedProjects:         10,
	Resources:             dbcloud.DefaultResourceQuota,
}

// Config is what the domain needs to know of the installation.
type Config struct {
	Sizes dbcloud.SizeTable
	// Regions are the known region codes; the first is the default.
	Regions []string
	Quotas  Quotas
	// PublicHost is the host name put into endpoints.
	PublicHost string
	// PortMin and PortMax bound the ports endpoints are allocated from.
	PortMin, PortMax int
}

// DefaultConfig returns the configuration of a single-host installation.
func DefaultConfig() Config {
	return Config{
		Sizes:      dbcloud.DefaultSizes,
		Regions:    []string{"local"},
		Quotas:     DefaultQuotas,
		PublicHost: "127.0.0.1",
		PortMin:    15432,
		PortMax:    25431,
	}
}

// Cloud is the domain service: it authorises every request, enforces every
// rule and records desired state together with the operation that makes it
// real. HTTP only translates to and from it.
type Cloud struct {
	Store   dbcloud.Store
	Runtime dbcloud.Runtime
	Config  Config
	Logger  *slog.Logger
	// Now is injected so tests can control time.
	Now func() time.Time
	// Notify, when set, is called after a write that may have recorded an
	// operation, so the engine starts at once instead of at its next poll.
	Notify func()
	// Network, when set, is told of VPCs as they are created and deleted.
	Network dbcloud.Network
	// PasswordTimeout bounds updatePassword's work on the tenant's database.
	PasswordTimeout time.Duration
	// History, when set, answers the metrics preview (history.go).
	History *history.Series
	// PasswordParams, when set, replaces the Argon2id costs of user
	// passwords (tests make them cheap).
	PasswordParams *identity.PasswordParams
	// credentials keeps verified credentials (authcache.go).
	credentials credentialCache
	// keyUses throttles the writes of keys' last use (keyuse.go).
	keyUses keyUses
	// dummy is a password hash nobody's password matches, made once, which
	// SignIn verifies for unknown users so they cost what known ones do.
	dummy struct {
		once sync.Once
		hash string
	}
}

// New returns a Cloud with the given dependencies.
func New(store dbcloud.Store, runtime dbcloud.Runtime, cfg Config, logger *slog.Logger) *Cloud {
	if logger == nil {
		logger = slog.Default()
	}
	c := &Cloud{Store: store, Runtime: runtime, Config: cfg, Logger: logger, Now: time.Now, PasswordTimeout: DefaultPasswordTimeout}
	if b := dbcloud.CapabilitiesOf(runtime).PasswordBudget; b != nil {
		c.PasswordTimeout = b.PasswordBudget()
	}
	if ss, ok := dbcloud.UnwrapStore(store).(dbcloud.SeriesStore); ok {
		c.History = &history.Series{Store: ss}
	}
	return c
}

func (c *Cloud) now() time.Time { return c.Now().UTC().Truncate(time.Microsecond) }

type principalKey struct{}
type idempotencyKey struct{}

// NewContextWithPrincipal returns ctx carrying the authenticated caller.
func NewContextWithPrincipal(ctx context.Context, p *dbcloud.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFromContext returns the authenticated caller, or nil.
func PrincipalFromContext(ctx context.Context) *dbcloud.Principal {
	p, _ := ctx.Value(principalKey{}).(*dbcloud.Principal)
	return p
}

// NewContextWithIdempotency returns ctx carrying the idempotency claim of the
// request; the first write transaction of the request records it.
func NewContextWithIdempotency(ctx context.Context, r *dbcloud.IdempotencyRecord) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, r)
}

// withoutIdempotency is ctx for a request's later write transactions: its
// idempotency claim is recorded once, by the first.
func withoutIdempotency(ctx context.Context) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, (*dbcloud.IdempotencyRecord)(nil))
}

func idempotencyFromContext(ctx context.Context) *dbcloud.IdempotencyRecord {
	r, _ := ctx.Value(idempotencyKey{}).(*dbcloud.IdempotencyRecord)
	return r
}

// authorize lets the caller read the project; see authorizeTo.
func (c *Cloud) authorize(ctx context.Context, projectID string) error {
	_, err := c.authorizeTo(ctx, projectID, identity.Read)
	return err
}

// authorizeWrite lets the caller change the project's services, replica
// sets, VPCs and peerings.
func (c *Cloud) authorizeWrite(ctx context.Context, projectID string) error {
	_, err := c.authorizeTo(ctx, projectID, identity.ChangeResources)
	return err
}

// authorizeTo returns the caller's role in the project if it allows the
// action. Projects the caller cannot see answer not-found, so that their
// existence is not leaked; a member whose role is too low gets 403, which
// says which role would do.
func (c *Cloud) authorizeTo(ctx context.Context, projectID string, a identity.Action) (identity.Role, error) {
	p := PrincipalFromContext(ctx)
	if p == nil {
		return "", dbcloud.Errorf(dbcloud.KindUnauthorized, "Authentication required.")
	}
	role, ok := p.RoleIn(projectID)
	if !ok {
		return "", dbcloud.Errorf(dbcloud.KindNotFound, "Project %q not found.", projectID)
	}
	if !role.Allows(a) {
		return "", dbcloud.Errorf(dbcloud.KindForbidden, "Your role in this project is %s, which may not %s (docs/roles.md).", role, actionText[a])
	}
	return role, nil
}

var actionText = map[identity.Action]string{
	identity.Read:            "read it",
	identity.MintReadOnly:    "make or revoke READ_ONLY database credentials",
	identity.ChangeResources: "change services, replica sets or VPCs, or make READ_WRITE database credentials; ask an admin for the developer role",
	identity.ManageKeys:      "create or revoke API keys; ask an owner for the admin role",
	identity.ManageMembers:   "manage members; ask an owner for the admin role",
	identity.DeleteProject:   "delete the project; only owners may",
}

// update runs fn in a write transaction that holds the project's lock and
// records the request's idempotency claim with the change it made.
func (c *Cloud) update(ctx context.Context, projectID string, fn func(tx dbcloud.Tx) error) error {
	return c.updateAs(ctx, projectID, identity.ChangeResources, fn)
}

// updateAs is update for a write that action allows (a viewer's READ_ONLY
// credential is a write a reader may make).
func (c *Cloud) updateAs(ctx context.Context, projectID string, action identity.Action, fn func(tx dbcloud.Tx) error) error {
	// Every request's write comes through here: a second check, so that an
	// operation that forgot its own cannot write for a reader.
	if _, err := c.authorizeTo(ctx, projectID, action); err != nil {
		return err
	}
	defer func() {
		if c.Notify != nil {
			c.Notify()
		}
	}()
	return c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if err := tx.LockProject(projectID); err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			return err
		}
		if r := idempotencyFromContext(ctx); r != nil {
			r.Created = c.now()
			if err := tx.InsertIdempotency(r); err != nil {
				if dbcloud.IsConflict(err) {
					return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeIdempotencyInProgress,
						"Another request with this Idempotency-Key was accepted first; retry to get its response.")
				}
				return err
			}
		}
		return nil
	})
}

// view runs fn in a read transaction after authorising the project.
func (c *Cloud) view(ctx context.Context, projectID string, fn func(tx dbcloud.Tx) error) error {
	if err := c.authorize(ctx, projectID); err != nil {
		return err
	}
	return c.Store.View(ctx, fn)
}

// claim tells the request's idempotency record which resource it created.
func claim(ctx context.Context, kind, id string) {
	if r := idempotencyFromContext(ctx); r != nil {
		r.ResourceKind, r.ResourceID = kind, id
	}
}

// Authenticate checks an access key and secret. Failures are indistinguishable
// to the caller, and the secret is compared in constant time.
//
// A key that passed is kept verified until anything authentication reads
// changes in the store (credentialCache), so most requests cost one read
// of a counter instead of four lookups.
func (c *Cloud) Authenticate(ctx context.Context, accessKey, secret string) (*dbcloud.Principal, error) {
	hash := dbcloud.HashSecret(secret)
	p, err := c.cachedCredential(ctx, "key/"+accessKey, hash, func() (*dbcloud.Principal, error) {
		return c.checkKey(ctx, accessKey, hash)
	})
	if err != nil {
		return nil, err
	}
	c.recordKeyUse(ctx, accessKey)
	return p, nil
}

// checkKey is Authenticate's full check, against the store.
func (c *Cloud) checkKey(ctx context.Context, accessKey string, hash []byte) (*dbcloud.Principal, error) {
	unauthorized := dbcloud.Errorf(dbcloud.KindUnauthorized, "Invalid or revoked API key.")
	var p dbcloud.Principal
	err := c.Store.View(ctx, func(tx dbcloud.Tx) error {
		k, err := tx.FindAPIKey(accessKey)
		if dbcloud.IsNotFound(err) {
			// The secret was hashed before the lookup, so unknown keys
			// take as long as wrong secrets.
			return unauthorized
		} else if err != nil {
			return err
		}
		if subtle.ConstantTimeCompare(hash, k.SecretHash) != 1 || k.Revoked != nil {
			return unauthorized
		}
		p.Key = k
		if p.Project, err = tx.FindProject(k.ProjectID); err != nil {
			return fmt.Errorf("project of key %s: %w", k.AccessKey, err)
		}
		if p.User, err = tx.FindUser(k.UserID); err != nil {
			return fmt.Errorf("user of key %s: %w", k.AccessKey, err)
		}
		// A key acts for its issuer: it stops with the issuer's membership
		// and never does more than the issuer may do now.
		m, err := tx.FindMembership(k.ProjectID, k.UserID)
		if dbcloud.IsNotFound(err) || p.User.Disabled != nil {
			return unauthorized
		} else if err != nil {
			return err
		}
		role := k.Role
		if m.Role.Rank() < role.Rank() {
			role = m.Role
		}
		p.Roles = map[string]identity.Role{k.ProjectID: role}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// ListProjects lists the projects the caller can see: a key sees its own,
// a user every project they are a member of.
func (c *Cloud) ListProjects(ctx context.Context) ([]*dbcloud.Project, error) {
	p := PrincipalFromContext(ctx)
	if p == nil {
		return nil, dbcloud.Errorf(dbcloud.KindUnauthorized, "Authentication required.")
	}
	if p.Key != nil {
		return []*dbcloud.Project{p.Project}, nil
	}
	out := []*dbcloud.Project{}
	err := c.Store.View(ctx, func(tx dbcloud.Tx) error {
		ms, err := tx.ListMemberships(p.User.ID)
		if err != nil {
			return err
		}
		for _, m := range ms {
			pr, err := tx.FindProject(m.ProjectID)
			if err != nil {
				return err
			}
			out = append(out, pr)
		}
		return nil
	})
	return out, err
}

// resolveRegion returns the region to use, the default when code is empty.
func (c *Cloud) resolveRegion(code string) (string, error) {
	if code == "" {
		return c.Config.Regions[0], nil
	}
	if slices.Contains(c.Config.Regions, code) {
		return code, nil
	}
	return "", dbcloud.Errorf(dbcloud.KindInvalid, "region_code %q is unknown; known regions: %s.", code, strings.Join(c.Config.Regions, ", "))
}

func quotaError(format string, args ...any) error {
	return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeQuotaExceeded, format, args...)
}

// FindIdempotency returns the caller's record of an Idempotency-Key, or nil
// when the key is new or older than IdempotencyTTL.
func (c *Cloud) FindIdempotency(ctx context.Context, credential, key string) (*dbcloud.IdempotencyRecord, error) {
	var rec *dbcloud.IdempotencyRecord
	err := c.Store.View(ctx, func(tx dbcloud.Tx) error {
		r, err := tx.FindIdempotency(credential, key)
		if dbcloud.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		if c.now().Sub(r.Created) < dbcloud.IdempotencyTTL {
			rec = r
		}
		return nil
	})
	return rec, err
}

// CompleteIdempotency stores the first response of a request with an
// Idempotency-Key, so that repeats replay it.
func (c *Cloud) CompleteIdempotency(ctx context.Context, rec *dbcloud.IdempotencyRecord) error {
	return c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		old, err := tx.FindIdempotency(rec.Credential, rec.Key)
		switch {
		case dbcloud.IsNotFound(err):
			// The request changed nothing through a transaction (a no-op
			// repeat): remember its response all the same.
			rec.Created = c.now()
			return tx.InsertIdempotency(rec)
		case err != nil:
			return err
		}
		if c.now().Sub(old.Created) >= dbcloud.IdempotencyTTL {
			rec.Created = c.now()
		} else {
			rec.Created = old.Created
		}
		return tx.UpdateIdempotency(rec)
	})
}

// PurgeIdempotency forgets keys older than IdempotencyTTL.
func (c *Cloud) PurgeIdempotency(ctx context.Context) (int, error) {
	var n int
	err := c.Store.Update(ctx, func(tx dbcloud.Tx) (err error) {
		n, err = tx.DeleteIdempotencyBefore(c.now().Add(-dbcloud.IdempotencyTTL))
		return err
	})
	return n, err
}

// Ping checks that the store answers, for readiness probes.
func (c *Cloud) Ping(ctx context.Context) error {
	return c.Store.View(ctx, func(tx dbcloud.Tx) error {
		_, err := tx.ListProjects()
		return err
	})
}
