package cloud

import (
	"context"
	"fmt"
	"net/mail"
	"strings"
	"time"

	"dbcloud"

	"dbcloud/identity"
)

// IssueUserToken makes a token of the kind for the user within tx and
// returns its secret, shown once.
func (c *Cloud) IssueUserToken(tx dbcloud.Tx, t *dbcloud.UserToken, ttl time.Duration) (string, error) {
	secret := dbcloud.NewTokenSecret(t.Kind)
	t.Hash = dbcloud.HashToken(secret)
	t.Created = c.now()
	t.Expires = t.Created.Add(ttl)
	if t.Family == "" {
		t.Family = dbcloud.NewID() + dbcloud.NewID()
	}
	if err := tx.InsertUserToken(t); err != nil {
		return "", err
	}
	return secret, nil
}

// RevokeFamily revokes every live token of a login within tx.
func (c *Cloud) RevokeFamily(tx dbcloud.Tx, family string) error {
	toks, err := tx.ListTokenFamily(family)
	if err != nil {
		return err
	}
	return c.revokeTokens(tx, toks)
}

// revokeTokens revokes those of toks still live, within tx.
func (c *Cloud) revokeTokens(tx dbcloud.Tx, toks []*dbcloud.UserToken) error {
	now := c.now()
	for _, t := range toks {
		if t.Revoked == nil {
			t.Revoked = &now
			if err := tx.UpdateUserToken(t); err != nil {
				return err
			}
		}
	}
	return nil
}

// SignOutEverywhere ends every console session and OAuth login of the
// calling user, on every device, this one included.
func (c *Cloud) SignOutEverywhere(ctx context.Context) error {
	p := PrincipalFromContext(ctx)
	if p == nil || p.User == nil || p.Key != nil {
		return dbcloud.Errorf(dbcloud.KindUnauthorized, "Only a signed-in user can sign out.")
	}
	return c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		toks, err := tx.ListUserTokens(p.User.ID)
		if err != nil {
			return err
		}
		return c.revokeTokens(tx, toks)
	})
}

// AuthenticateToken checks a user's access token (API) or session token
// (console) and returns the user as the caller, with a role in each
// project the user belongs to.
//
// As for keys, a token that passed is kept verified until anything
// authentication reads changes in the store; its expiry is checked on
// every request.
func (c *Cloud) AuthenticateToken(ctx context.Context, kind, secret string) (*dbcloud.Principal, error) {
	hash := dbcloud.HashToken(secret)
	p, err := c.cachedCredential(ctx, "token/"+kind+"/"+string(hash), nil, func() (*dbcloud.Principal, error) {
		return c.checkToken(ctx, kind, hash)
	})
	if err != nil {
		return nil, err
	}
	if !p.Token.Live(c.now()) {
		return nil, tokenRefused()
	}
	return p, nil
}

// tokenRefused is the one answer to every token that does not pass.
func tokenRefused() error {
	return dbcloud.Errorf(dbcloud.KindUnauthorized, "Invalid, expired or revoked token; sign in again.")
}

// checkToken is AuthenticateToken's full check, against the store.
func (c *Cloud) checkToken(ctx context.Context, kind string, hash []byte) (*dbcloud.Principal, error) {
	unauthorized := tokenRefused()
	var p dbcloud.Principal
	err := c.Store.View(ctx, func(tx dbcloud.Tx) error {
		t, err := tx.FindUserToken(hash)
		if dbcloud.IsNotFound(err) {
			return unauthorized
		} else if err != nil {
			return err
		}
		if t.Kind != kind || !t.Live(c.now()) {
			return unauthorized
		}
		u, err := tx.FindUser(t.UserID)
		if err != nil {
			return fmt.Errorf("user of token: %w", err)
		}
		if u.Disabled != nil {
			return unauthorized
		}
		ms, err := tx.ListMemberships(u.ID)
		if err != nil {
			return err
		}
		p = dbcloud.Principal{User: u, Token: t, Roles: map[string]identity.Role{}}
		for _, m := range ms {
			p.Roles[m.ProjectID] = m.Role
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// SignIn checks a user's e-mail address and password. Every failure has
// the same message, and an unknown address costs a hash like a known one,
// so neither the answer nor its time tells which addresses exist.
func (c *Cloud) SignIn(ctx context.Context, email, password string) (*dbcloud.User, error) {
	wrong := dbcloud.Errorf(dbcloud.KindUnauthorized, "Wrong e-mail address or password.")
	var u *dbcloud.User
	err := c.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		u, err = tx.FindUserByEmail(email)
		if dbcloud.IsNotFound(err) {
			u = nil
			return nil
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	// Hashing happens outside the store transaction: it is slow on purpose.
	var hash string
	if u != nil && u.PasswordHash != "" {
		hash = u.PasswordHash
	} else {
		hash = c.dummyHash()
	}
	ok, err := identity.VerifyPassword(password, hash)
	if err != nil || !ok || u == nil || u.PasswordHash == "" || u.Disabled != nil {
		return nil, wrong
	}
	return u, nil
}

// dummyHash is a hash of nothing anyone knows, verified for unknown users.
func (c *Cloud) dummyHash() string {
	c.dummy.once.Do(func() {
		c.dummy.hash, _ = identity.HashPassword(identity.NewPassword(), c.passwordParams())
	})
	return c.dummy.hash
}

func (c *Cloud) passwordParams() identity.PasswordParams {
	if c.PasswordParams != nil {
		return *c.PasswordParams
	}
	return identity.DefaultPasswordParams
}

// normalEmail checks an address and returns it as stored: trimmed, and
// compared without regard to case.
func normalEmail(email string) (string, error) {
	email = strings.TrimSpace(email)
	a, err := mail.ParseAddress(email)
	if err != nil || a.Address != email || !strings.Contains(email[strings.LastIndex(email, "@")+1:], ".") {
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "e-mail %q is not an address with a dotted domain.", email)
	}
	return email, nil
}

// NewUser is what the operator gives to create a user.
type NewUser struct {
	Email, Name, Password string
	// ProjectID and Role, when set, make the user a member at once.
	ProjectID string
	Role      identity.Role
}

// CreateUser creates a user (operator only: dbcloud admin user create).
// With an empty password one is generated and returned, shown once.
func (c *Cloud) CreateUser(ctx context.Context, in NewUser) (*dbcloud.User, string, error) {
	email, err := normalEmail(in.Email)
	if err != nil {
		return nil, "", err
	}
	if in.Name, err = dbcloud.NormalName("name", in.Name); err != nil {
		return nil, "", err
	}
	pw := in.Password
	if pw == "" {
		pw = identity.NewPassword()
	} else if err := identity.CheckPassword(pw); err != nil {
		return nil, "", dbcloud.Errorf(dbcloud.KindInvalid, "%s.", err)
	}
	if in.ProjectID != "" && !in.Role.Valid() {
		return nil, "", dbcloud.Errorf(dbcloud.KindInvalid, "role must be one of viewer, developer, admin, owner; got %q.", in.Role)
	}
	hash, err := identity.HashPassword(pw, c.passwordParams())
	if err != nil {
		return nil, "", err
	}
	u := &dbcloud.User{ID: dbcloud.NewID(), Email: email, Name: in.Name, PasswordHash: hash, Created: c.now()}
	err = c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if _, err := tx.FindUserByEmail(email); err == nil {
			return dbcloud.Errorf(dbcloud.KindConflict, "A user with e-mail %s exists already.", email)
		} else if !dbcloud.IsNotFound(err) {
			return err
		}
		if in.ProjectID != "" {
			if _, err := tx.FindProject(in.ProjectID); dbcloud.IsNotFound(err) {
				return dbcloud.Errorf(dbcloud.KindNotFound, "Project %q not found.", in.ProjectID)
			} else if err != nil {
				return err
			}
		}
		if err := tx.InsertUser(u); err != nil {
			return err
		}
		if in.ProjectID != "" {
			return tx.InsertMembership(&dbcloud.Membership{ProjectID: in.ProjectID, UserID: u.ID, Role: in.Role, Created: c.now()})
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return u, pw, nil
}

// ListUsersAdmin lists every user, for the operator.
func (c *Cloud) ListUsersAdmin(ctx context.Context) ([]*dbcloud.User, error) {
	var out []*dbcloud.User
	err := c.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		out, err = tx.ListUsers()
		return err
	})
	return out, err
}

// DisableUser stops a user (operator only): sign-in, tokens, sessions and
// the user's API keys all fail from the next request on.
func (c *Cloud) DisableUser(ctx context.Context, email string) error {
	return c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		u, err := tx.FindUserByEmail(email)
		if dbcloud.IsNotFound(err) {
			return dbcloud.Errorf(dbcloud.KindNotFound, "No user with e-mail %s.", email)
		} else if err != nil {
			return err
		}
		if u.Disabled == nil {
			now := c.now()
			u.Disabled = &now
			return tx.UpdateUser(u)
		}
		return nil
	})
}

// Member is a membership with its user, for listing.
type Member struct {
	User *dbcloud.User
	Role identity.Role
}

// ListMembers lists a project's members.
func (c *Cloud) ListMembers(ctx context.Context, projectID string) ([]Member, error) {
	var out []Member
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) error {
		ms, err := tx.ListMembers(projectID)
		if err != nil {
			return err
		}
		for _, m := range ms {
			u, err := tx.FindUser(m.UserID)
			if err != nil {
				return err
			}
			out = append(out, Member{User: u, Role: m.Role})
		}
		return nil
	})
	return out, err
}

// SetMember adds the user with the e-mail address to the project with the
// role, or changes the role of a member. Admins manage roles below owner;
// owners any; the last owner cannot be demoted, so a project always has one.
func (c *Cloud) SetMember(ctx context.Context, projectID, email string, role identity.Role) error {
	caller, err := c.authorizeTo(ctx, projectID, identity.ManageMembers)
	if err != nil {
		return err
	}
	if !role.Valid() {
		return dbcloud.Errorf(dbcloud.KindInvalid, "role must be one of viewer, developer, admin, owner; got %q.", role)
	}
	if !caller.MayGrant(role) {
		return dbcloud.Errorf(dbcloud.KindForbidden, "Your role %s may not grant the role %s.", caller, role)
	}
	return c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		u, err := tx.FindUserByEmail(strings.TrimSpace(email))
		if dbcloud.IsNotFound(err) {
			return dbcloud.Errorf(dbcloud.KindNotFound, "No user with e-mail %s; the operator creates users with dbcloud admin user create.", email)
		} else if err != nil {
			return err
		}
		m, err := tx.FindMembership(projectID, u.ID)
		if dbcloud.IsNotFound(err) {
			return tx.InsertMembership(&dbcloud.Membership{ProjectID: projectID, UserID: u.ID, Role: role, Created: c.now()})
		} else if err != nil {
			return err
		}
		if !caller.MayGrant(m.Role) {
			return dbcloud.Errorf(dbcloud.KindForbidden, "Your role %s may not change a member whose role is %s.", caller, m.Role)
		}
		if err := c.keepAnOwner(tx, projectID, m, role); err != nil {
			return err
		}
		m.Role = role
		return tx.UpdateMembership(m)
	})
}

// RemoveMember takes a user out of the project and revokes, in the same
// transaction, every key the user issued there. A key acts for its issuer
// (checkKey), so the missing membership alone would refuse it; but adding
// the user back would bring every such key back to life, keys the owner
// meant to end with the removal.
func (c *Cloud) RemoveMember(ctx context.Context, projectID, userID string) error {
	caller, err := c.authorizeTo(ctx, projectID, identity.ManageMembers)
	if err != nil {
		return err
	}
	return c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		m, err := tx.FindMembership(projectID, userID)
		if dbcloud.IsNotFound(err) {
			return dbcloud.Errorf(dbcloud.KindNotFound, "User %q is not a member of this project.", userID)
		} else if err != nil {
			return err
		}
		if !caller.MayGrant(m.Role) {
			return dbcloud.Errorf(dbcloud.KindForbidden, "Your role %s may not remove a member whose role is %s.", caller, m.Role)
		}
		if err := c.keepAnOwner(tx, projectID, m, ""); err != nil {
			return err
		}
		if err := c.revokeMemberKeys(tx, projectID, userID); err != nil {
			return err
		}
		return tx.DeleteMembership(projectID, userID)
	})
}

// revokeMemberKeys revokes the keys userID issued in the project.
func (c *Cloud) revokeMemberKeys(tx dbcloud.Tx, projectID, userID string) error {
	keys, err := tx.ListAPIKeys(projectID)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k.UserID != userID {
			continue
		}
		if err := c.revokeKey(tx, k); err != nil {
			return fmt.Errorf("revoke key %s of a removed member: %w", k.AccessKey, err)
		}
	}
	return nil
}

func (c *Cloud) keepAnOwner(tx dbcloud.Tx, projectID string, m *dbcloud.Membership, next identity.Role) error {
	if m.Role != identity.Owner || next == identity.Owner {
		return nil
	}
	ms, err := tx.ListMembers(projectID)
	if err != nil {
		return err
	}
	owners := 0
	for _, x := range ms {
		if x.Role == identity.Owner {
			owners++
		}
	}
	if owners <= 1 {
		return dbcloud.Errorf(dbcloud.KindConflict, "This is the project's last owner; make another member owner first.")
	}
	return nil
}

// ProjectAPIKeys lists the project's API keys (never their secrets).
func (c *Cloud) ProjectAPIKeys(ctx context.Context, projectID string) ([]*dbcloud.APIKey, error) {
	var out []*dbcloud.APIKey
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		out, err = tx.ListAPIKeys(projectID)
		return err
	})
	return out, err
}

// IssueAPIKey creates an API key for the project on behalf of the signed-in
// user, with a role no higher than the user's own.
func (c *Cloud) IssueAPIKey(ctx context.Context, projectID, name string, role identity.Role) (*NewAPIKey, error) {
	caller, err := c.authorizeTo(ctx, projectID, identity.ManageKeys)
	if err != nil {
		return nil, err
	}
	name, err = dbcloud.NormalName("name", name)
	if err != nil {
		return nil, err
	}
	if !role.Valid() {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "role must be one of viewer, developer, admin, owner; got %q.", role)
	}
	if role.Rank() > caller.Rank() {
		return nil, dbcloud.Errorf(dbcloud.KindForbidden, "A key's role cannot be above yours (%s).", caller)
	}
	p := PrincipalFromContext(ctx)
	if p.User == nil {
		return nil, dbcloud.Errorf(dbcloud.KindForbidden, "Only a signed-in user issues API keys.")
	}
	var k *NewAPIKey
	err = c.update(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		k, err = c.issueKey(tx, projectID, p.User.ID, name, role)
		return err
	})
	return k, err
}

// RevokeProjectAPIKey revokes one of the project's keys.
func (c *Cloud) RevokeProjectAPIKey(ctx context.Context, projectID, accessKey string) error {
	if _, err := c.authorizeTo(ctx, projectID, identity.ManageKeys); err != nil {
		return err
	}
	return c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		k, err := tx.FindAPIKey(accessKey)
		if dbcloud.IsNotFound(err) || (err == nil && k.ProjectID != projectID) {
			return dbcloud.Errorf(dbcloud.KindNotFound, "API key %q not found.", accessKey)
		} else if err != nil {
			return err
		}
		return c.revokeKey(tx, k)
	})
}

// revokeKey marks the key revoked now, unless it already is: the first
// revocation's time stays.
func (c *Cloud) revokeKey(tx dbcloud.Tx, k *dbcloud.APIKey) error {
	if k.Revoked != nil {
		return nil
	}
	now := c.now()
	k.Revoked = &now
	return tx.UpdateAPIKey(k)
}

// Logout ends the caller's login: for a user's access token, its whole
// login (access and refresh tokens); and the login of the refresh token,
// when one is given, if it belongs to the caller. A refresh token of
// someone else, or none, changes nothing and is not an error, so the
// answer tells nothing of other people's tokens.
func (c *Cloud) Logout(ctx context.Context, refreshToken string) error {
	p := PrincipalFromContext(ctx)
	if p == nil {
		return dbcloud.Errorf(dbcloud.KindUnauthorized, "Authentication required.")
	}
	return c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if p.Token != nil {
			if err := c.RevokeFamily(tx, p.Token.Family); err != nil {
				return err
			}
		}
		if refreshToken == "" || p.Key != nil {
			return nil
		}
		t, err := tx.FindUserToken(dbcloud.HashToken(refreshToken))
		if dbcloud.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		if t.Kind != dbcloud.TokenRefresh || t.UserID != p.User.ID {
			return nil
		}
		return c.RevokeFamily(tx, t.Family)
	})
}

// PurgeUserTokens deletes codes, tokens and sessions that expired over a
// day ago (kept that long so a late replay still finds them refused).
func (c *Cloud) PurgeUserTokens(ctx context.Context) (int, error) {
	var n int
	err := c.Store.Update(ctx, func(tx dbcloud.Tx) (err error) {
		n, err = tx.DeleteUserTokensBefore(c.now().Add(-24 * time.Hour))
		return err
	})
	return n, err
}
