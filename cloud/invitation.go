package cloud

import (
	"context"
	"strings"

	"dbcloud"
	"dbcloud/identity"
)

// maxPendingInvitations bounds a project's open links, so that no member
// who may invite can fill the store with them.
const maxPendingInvitations = 100

// NewInvitation is an invitation just made, with its token, which is shown
// once (in the link the inviter copies) and never kept.
type NewInvitation struct {
	Invitation *dbcloud.Invitation
	Token      string
}

// Invite makes a one-time link that adds the person with the e-mail address
// to the project with the role. Who may invite, and to which roles, is who
// may add members (SetMember): admins below owner, owners any role. A new
// link for an address replaces its pending one.
func (c *Cloud) Invite(ctx context.Context, projectID, email string, role identity.Role) (*NewInvitation, error) {
	caller, err := c.authorizeTo(ctx, projectID, identity.ManageMembers)
	if err != nil {
		return nil, err
	}
	if email, err = normalEmail(email); err != nil {
		return nil, err
	}
	if !role.Valid() {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "role must be one of viewer, developer, admin, owner; got %q.", role)
	}
	if !caller.MayGrant(role) {
		return nil, dbcloud.Errorf(dbcloud.KindForbidden, "Your role %s may not grant the role %s.", caller, role)
	}
	token := dbcloud.NewTokenSecret("invite")
	now := c.now()
	inv := &dbcloud.Invitation{ID: dbcloud.NewID(), ProjectID: projectID, Email: email, Role: role,
		InvitedBy: PrincipalFromContext(ctx).User.ID, Hash: dbcloud.HashToken(token), Created: now, Expires: now.Add(dbcloud.InvitationTTL)}
	err = c.updateAs(ctx, projectID, identity.ManageMembers, func(tx dbcloud.Tx) error {
		if err := c.notAMember(tx, projectID, email); err != nil {
			return err
		}
		all, err := tx.ListInvitations(projectID)
		if err != nil {
			return err
		}
		pending := 0
		for _, old := range all {
			if !old.Pending(now) {
				continue
			}
			if !strings.EqualFold(old.Email, email) {
				pending++
				continue
			}
			old.Revoked = &now
			if err := tx.UpdateInvitation(old); err != nil {
				return err
			}
		}
		if pending >= maxPendingInvitations {
			return dbcloud.Errorf(dbcloud.KindConflict, "This project has %d pending invitations, the most it may have; revoke some first.", pending)
		}
		return tx.InsertInvitation(inv)
	})
	if err != nil {
		return nil, err
	}
	c.Logger.Info("invitation made", "project", projectID, "invitation", inv.ID, "role", role)
	return &NewInvitation{Invitation: inv, Token: token}, nil
}

// notAMember refuses an invitation for someone who is a member already:
// the members table changes their role.
func (c *Cloud) notAMember(tx dbcloud.Tx, projectID, email string) error {
	u, err := tx.FindUserByEmail(email)
	if dbcloud.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if _, err := tx.FindMembership(projectID, u.ID); err == nil {
		return dbcloud.Errorf(dbcloud.KindConflict, "%s is a member of this project already; change their role in the members table.", email)
	} else if !dbcloud.IsNotFound(err) {
		return err
	}
	return nil
}

// ListInvitations lists the project's pending invitations, for those who
// may invite.
func (c *Cloud) ListInvitations(ctx context.Context, projectID string) ([]*dbcloud.Invitation, error) {
	if _, err := c.authorizeTo(ctx, projectID, identity.ManageMembers); err != nil {
		return nil, err
	}
	out := []*dbcloud.Invitation{}
	now := c.now()
	err := c.Store.View(ctx, func(tx dbcloud.Tx) error {
		all, err := tx.ListInvitations(projectID)
		for _, i := range all {
			if i.Pending(now) {
				out = append(out, i)
			}
		}
		return err
	})
	return out, err
}

// RevokeInvitation withdraws a pending invitation: its link stops working.
// Withdrawing one that has ended already changes nothing.
func (c *Cloud) RevokeInvitation(ctx context.Context, projectID, id string) error {
	caller, err := c.authorizeTo(ctx, projectID, identity.ManageMembers)
	if err != nil {
		return err
	}
	return c.updateAs(ctx, projectID, identity.ManageMembers, func(tx dbcloud.Tx) error {
		inv, err := tx.FindInvitation(projectID, id)
		if dbcloud.IsNotFound(err) {
			return dbcloud.Errorf(dbcloud.KindNotFound, "Invitation %q not found.", id)
		} else if err != nil {
			return err
		}
		if !caller.MayGrant(inv.Role) {
			return dbcloud.Errorf(dbcloud.KindForbidden, "Your role %s may not withdraw an invitation to the role %s.", caller, inv.Role)
		}
		now := c.now()
		if !inv.Pending(now) {
			return nil
		}
		inv.Revoked = &now
		return tx.UpdateInvitation(inv)
	})
}

// InvitationView is what the invited person sees before accepting.
type InvitationView struct {
	Invitation *dbcloud.Invitation
	Project    *dbcloud.Project
	// Inviter is the inviting person's name.
	Inviter string
	// Existing is set when a user with the invited address exists: they
	// accept signed in as themselves, and set no password here.
	Existing bool
}

// OpenInvitation reads the invitation of a link, for its page. A wrong,
// used, withdrawn or expired link gets an error that says which, so the
// person knows what to do; the token is a 256-bit secret, so telling
// these apart tells a guesser nothing.
func (c *Cloud) OpenInvitation(ctx context.Context, token string) (*InvitationView, error) {
	var v InvitationView
	err := c.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		if v.Invitation, err = c.pendingInvitation(tx, token); err != nil {
			return err
		}
		if v.Project, err = tx.FindProject(v.Invitation.ProjectID); err != nil {
			return err
		}
		if u, err := tx.FindUser(v.Invitation.InvitedBy); err == nil {
			v.Inviter = u.Name
		}
		_, err = tx.FindUserByEmail(v.Invitation.Email)
		if v.Existing = err == nil; dbcloud.IsNotFound(err) {
			err = nil
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &v, nil
}

// pendingInvitation finds the invitation of token if its link still works
// (locked for update in a write transaction).
func (c *Cloud) pendingInvitation(tx dbcloud.Tx, token string) (*dbcloud.Invitation, error) {
	inv, err := tx.FindInvitationByHash(dbcloud.HashToken(token))
	if dbcloud.IsNotFound(err) {
		return nil, dbcloud.Errorf(dbcloud.KindNotFound, "This invitation link is not valid: check that it was copied whole, or ask for a new one.")
	} else if err != nil {
		return nil, err
	}
	switch {
	case inv.Accepted != nil:
		return nil, dbcloud.Errorf(dbcloud.KindConflict, "This invitation was used already, on %s; sign in instead.", inv.Accepted.Format("2006-01-02 15:04 UTC"))
	case inv.Revoked != nil:
		return nil, dbcloud.Errorf(dbcloud.KindConflict, "This invitation was withdrawn; ask the project's owner for a new one.")
	case !c.now().Before(inv.Expires):
		return nil, dbcloud.Errorf(dbcloud.KindConflict, "This invitation expired on %s; ask the project's owner for a new one.", inv.Expires.Format("2006-01-02 15:04 UTC"))
	}
	return inv, nil
}

// Acceptance is who accepted an invitation, and where they now belong.
type Acceptance struct {
	User      *dbcloud.User
	ProjectID string
}

// AcceptInvitation uses the link of token: the invited person becomes a
// member with the invitation's role, and the link stops working. A new
// person's account is made with the name and password given (the rules
// of one's own password change); a person with an account accepts while
// signed in as it, so that a link never sets an existing account's
// password.
func (c *Cloud) AcceptInvitation(ctx context.Context, token, name, password string) (*Acceptance, error) {
	v, err := c.OpenInvitation(ctx, token)
	if err != nil {
		return nil, err
	}
	email := v.Invitation.Email
	var fresh *dbcloud.User
	if v.Existing {
		p := PrincipalFromContext(ctx)
		if p == nil || p.User == nil || p.Key != nil || !strings.EqualFold(p.User.Email, email) {
			return nil, dbcloud.Errorf(dbcloud.KindConflict, "An account with the e-mail address %s exists: sign in as it, then open this link again.", email)
		}
	} else {
		if fresh, err = c.newInvitedUser(email, name, password); err != nil {
			return nil, err
		}
	}
	var out Acceptance
	err = c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if err := tx.LockProject(v.Invitation.ProjectID); err != nil {
			return err
		}
		// Checked again under the lock: two uses of one link at once
		// make one member.
		inv, err := c.pendingInvitation(tx, token)
		if err != nil {
			return err
		}
		if out.User, err = c.invitedUser(tx, email, fresh); err != nil {
			return err
		}
		if _, err := tx.FindMembership(inv.ProjectID, out.User.ID); dbcloud.IsNotFound(err) {
			err = tx.InsertMembership(&dbcloud.Membership{ProjectID: inv.ProjectID, UserID: out.User.ID, Role: inv.Role, Created: c.now()})
			if err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		now := c.now()
		inv.Accepted, inv.AcceptedBy = &now, out.User.ID
		out.ProjectID = inv.ProjectID
		return tx.UpdateInvitation(inv)
	})
	if err != nil {
		return nil, err
	}
	c.Logger.Info("invitation accepted", "project", out.ProjectID, "invitation", v.Invitation.ID, "user", out.User.ID)
	return &out, nil
}

// newInvitedUser checks the name and password of a new person and hashes
// the password, outside any transaction: hashing is slow on purpose.
func (c *Cloud) newInvitedUser(email, name, password string) (*dbcloud.User, error) {
	name, err := dbcloud.NormalName("name", name)
	if err != nil {
		return nil, err
	}
	if err := identity.CheckPassword(password); err != nil {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "password: %s.", err)
	}
	hash, err := identity.HashPassword(password, c.passwordParams())
	if err != nil {
		return nil, err
	}
	return &dbcloud.User{ID: dbcloud.NewID(), Email: email, Name: name, PasswordHash: hash, Created: c.now()}, nil
}

// invitedUser returns the user who accepts within tx: fresh, inserted, for
// a new person; else the account of the address.
func (c *Cloud) invitedUser(tx dbcloud.Tx, email string, fresh *dbcloud.User) (*dbcloud.User, error) {
	u, err := tx.FindUserByEmail(email)
	switch {
	case err == nil && fresh != nil:
		return nil, dbcloud.Errorf(dbcloud.KindConflict, "An account with the e-mail address %s was made meanwhile: sign in as it, then open this link again.", email)
	case err == nil:
		if u.Disabled != nil {
			return nil, dbcloud.Errorf(dbcloud.KindForbidden, "The account %s is disabled.", email)
		}
		return u, nil
	case !dbcloud.IsNotFound(err):
		return nil, err
	case fresh == nil:
		return nil, dbcloud.Errorf(dbcloud.KindConflict, "The account %s is gone; ask for a new invitation.", email)
	}
	return fresh, tx.InsertUser(fresh)
}
