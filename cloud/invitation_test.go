package cloud_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/cloud"
	"dbcloud/identity"
	"dbcloud/sqlite"
)

// people is a Cloud on a fresh SQLite store with its first owner, a clock
// the test moves, and contexts signed in as people.
type people struct {
	c     *cloud.Cloud
	boot  *cloud.Bootstrap
	clock time.Time
}

func newPeople(t *testing.T) *people {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "dbcloud.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p := &people{clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	p.c = cloud.New(s, nil, cloud.DefaultConfig(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	p.c.Now = func() time.Time { return p.clock }
	p.c.PasswordParams = &identity.PasswordParams{Time: 1, Memory: 1024, Threads: 1}
	if p.boot, err = p.c.Bootstrap(t.Context(), "owner", "owner@example.com"); err != nil {
		t.Fatal(err)
	}
	return p
}

// as returns a context signed in as the user (a console session).
func (p *people) as(t *testing.T, userID string) context.Context {
	t.Helper()
	var secret string
	err := p.c.Store.Update(t.Context(), func(tx dbcloud.Tx) (err error) {
		secret, err = p.c.IssueUserToken(tx, &dbcloud.UserToken{Kind: dbcloud.TokenSession, UserID: userID}, time.Hour)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := p.c.AuthenticateToken(t.Context(), dbcloud.TokenSession, secret)
	if err != nil {
		t.Fatal(err)
	}
	return cloud.NewContextWithPrincipal(t.Context(), pr)
}

func (p *people) owner(t *testing.T) context.Context { return p.as(t, p.boot.User.ID) }

func wantKind(t *testing.T, what string, err error, kind dbcloud.ErrorKind, text string) {
	t.Helper()
	if dbcloud.ErrorKindOf(err) != kind || !strings.Contains(err.Error(), text) {
		t.Errorf("%s: %v, want a %v error saying %q", what, err, kind, text)
	}
}

func (p *people) members(t *testing.T) map[string]identity.Role {
	t.Helper()
	ms, err := p.c.ListMembers(p.owner(t), p.boot.Project.ID)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]identity.Role{}
	for _, m := range ms {
		out[m.User.Email] = m.Role
	}
	return out
}

func TestCloud_Invite(t *testing.T) {
	p := newPeople(t)
	pid := p.boot.Project.ID
	inv, err := p.c.Invite(p.owner(t), pid, " New@Example.com ", identity.Developer)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("StoredHashed", func(t *testing.T) {
		err := p.c.Store.View(t.Context(), func(tx dbcloud.Tx) error {
			got, err := tx.FindInvitationByHash(dbcloud.HashToken(inv.Token))
			if err != nil {
				return err
			}
			if string(got.Hash) == inv.Token || got.Email != "New@Example.com" || !got.Expires.Equal(p.clock.Add(7*24*time.Hour)) {
				t.Errorf("stored invitation %+v", got)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(inv.Token, "dbc_invite_") {
			t.Errorf("token %q", inv.Token)
		}
	})
	t.Run("ErrRoles", func(t *testing.T) {
		dev, _, err := p.c.CreateUser(t.Context(), cloud.NewUser{Email: "dev@example.com", Name: "dev", Password: "correct horse battery", ProjectID: pid, Role: identity.Developer})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.c.Invite(p.as(t, dev.ID), pid, "x@example.com", identity.Viewer)
		wantKind(t, "a developer invites", err, dbcloud.KindForbidden, "may not manage members")
		adm, _, err := p.c.CreateUser(t.Context(), cloud.NewUser{Email: "adm@example.com", Name: "adm", Password: "correct horse battery", ProjectID: pid, Role: identity.Admin})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.c.Invite(p.as(t, adm.ID), pid, "x@example.com", identity.Owner)
		wantKind(t, "an admin invites an owner", err, dbcloud.KindForbidden, "may not grant the role owner")
		_, err = p.c.Invite(p.owner(t), pid, "dev@example.com", identity.Admin)
		wantKind(t, "inviting a member", err, dbcloud.KindConflict, "is a member of this project already")
		_, err = p.c.Invite(p.owner(t), pid, "not an address", identity.Admin)
		wantKind(t, "inviting no address", err, dbcloud.KindInvalid, "is not an address")
	})
	t.Run("Listed", func(t *testing.T) {
		l, err := p.c.ListInvitations(p.owner(t), pid)
		if err != nil || len(l) != 1 || l[0].ID != inv.Invitation.ID {
			t.Fatalf("ListInvitations: %v %+v", err, l)
		}
	})
	t.Run("ErrPassword", func(t *testing.T) {
		_, err := p.c.AcceptInvitation(t.Context(), inv.Token, "New Person", "short")
		wantKind(t, "a short password", err, dbcloud.KindInvalid, "password: ")
		_, err = p.c.AcceptInvitation(t.Context(), inv.Token, "   ", "correct horse battery")
		wantKind(t, "a blank name", err, dbcloud.KindInvalid, "name must contain a visible character")
	})
	t.Run("ErrWrongToken", func(t *testing.T) {
		_, err := p.c.AcceptInvitation(t.Context(), inv.Token+"x", "New Person", "correct horse battery")
		wantKind(t, "a wrong token", err, dbcloud.KindNotFound, "not valid")
	})
	t.Run("Accept", func(t *testing.T) {
		a, err := p.c.AcceptInvitation(t.Context(), inv.Token, " New Person ", "correct horse battery")
		if err != nil {
			t.Fatal(err)
		}
		if a.ProjectID != pid || a.User.Name != "New Person" {
			t.Errorf("accepted: %+v", a)
		}
		if got := p.members(t)["New@Example.com"]; got != identity.Developer {
			t.Errorf("the new member's role is %q, want developer", got)
		}
		if _, err := p.c.SignIn(t.Context(), "new@example.com", "correct horse battery"); err != nil {
			t.Errorf("sign in with the password set: %v", err)
		}
	})
	t.Run("ErrUsedTwice", func(t *testing.T) {
		_, err := p.c.AcceptInvitation(t.Context(), inv.Token, "Someone Else", "another good password")
		wantKind(t, "the link used twice", err, dbcloud.KindConflict, "used already")
		if _, err := p.c.SignIn(t.Context(), "new@example.com", "another good password"); err == nil {
			t.Error("the second use set the password")
		}
		if l, _ := p.c.ListInvitations(p.owner(t), pid); len(l) != 0 {
			t.Errorf("pending after use: %+v", l)
		}
	})
}

func TestCloud_InviteEnds(t *testing.T) {
	p := newPeople(t)
	pid := p.boot.Project.ID
	t.Run("Expired", func(t *testing.T) {
		inv, err := p.c.Invite(p.owner(t), pid, "late@example.com", identity.Viewer)
		if err != nil {
			t.Fatal(err)
		}
		p.clock = p.clock.Add(dbcloud.InvitationTTL)
		_, err = p.c.AcceptInvitation(t.Context(), inv.Token, "Late", "correct horse battery")
		wantKind(t, "an expired link", err, dbcloud.KindConflict, "expired")
		if _, ok := p.members(t)["late@example.com"]; ok {
			t.Error("an expired link made a member")
		}
	})
	t.Run("Revoked", func(t *testing.T) {
		inv, err := p.c.Invite(p.owner(t), pid, "gone@example.com", identity.Viewer)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.c.RevokeInvitation(p.owner(t), pid, inv.Invitation.ID); err != nil {
			t.Fatal(err)
		}
		_, err = p.c.AcceptInvitation(t.Context(), inv.Token, "Gone", "correct horse battery")
		wantKind(t, "a withdrawn link", err, dbcloud.KindConflict, "withdrawn")
		if _, err := p.c.SignIn(t.Context(), "gone@example.com", "correct horse battery"); err == nil {
			t.Error("a withdrawn link made an account")
		}
	})
	t.Run("Replaced", func(t *testing.T) {
		first, err := p.c.Invite(p.owner(t), pid, "twice@example.com", identity.Viewer)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.c.Invite(p.owner(t), pid, "TWICE@example.com", identity.Admin); err != nil {
			t.Fatal(err)
		}
		_, err = p.c.AcceptInvitation(t.Context(), first.Token, "Twice", "correct horse battery")
		wantKind(t, "a replaced link", err, dbcloud.KindConflict, "withdrawn")
	})
	t.Run("ExistingAccount", func(t *testing.T) {
		other := newProjectOf(t, p)
		inv, err := p.c.Invite(p.as(t, other.owner), other.pid, "owner@example.com", identity.Viewer)
		if err != nil {
			t.Fatal(err)
		}
		// A link never sets an existing account's password.
		_, err = p.c.AcceptInvitation(t.Context(), inv.Token, "Thief", "correct horse battery")
		wantKind(t, "an existing account, not signed in", err, dbcloud.KindConflict, "sign in as it")
		a, err := p.c.AcceptInvitation(p.owner(t), inv.Token, "", "")
		if err != nil || a.User.ID != p.boot.User.ID || a.ProjectID != other.pid {
			t.Fatalf("accept signed in: %v %+v", err, a)
		}
	})
}

type otherProject struct{ owner, pid string }

// newProjectOf makes a second person who owns a second project.
func newProjectOf(t *testing.T, p *people) otherProject {
	t.Helper()
	u, _, err := p.c.CreateUser(t.Context(), cloud.NewUser{Email: "other@example.com", Name: "other", Password: "correct horse battery"})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := p.c.CreateOwnProject(p.as(t, u.ID), "other's")
	if err != nil {
		t.Fatal(err)
	}
	return otherProject{owner: u.ID, pid: pr.ID}
}

func TestCloud_CreateOwnProject(t *testing.T) {
	p := newPeople(t)
	ctx := p.owner(t)
	_, err := p.c.CreateOwnProject(ctx, " \t ")
	wantKind(t, "a blank name", err, dbcloud.KindInvalid, "name must contain a visible character")
	pr, err := p.c.CreateOwnProject(ctx, "  Second  ")
	if err != nil {
		t.Fatal(err)
	}
	if pr.Name != "Second" {
		t.Errorf("name %q, want it trimmed", pr.Name)
	}
	// The creator owns it: the next session sees it, and may invite an owner.
	ps, err := p.c.ListProjects(p.owner(t))
	if err != nil || len(ps) != 2 || (ps[0].ID != pr.ID && ps[1].ID != pr.ID) {
		t.Fatalf("ListProjects: %v %+v", err, ps)
	}
	if _, err := p.c.Invite(p.owner(t), pr.ID, "x@example.com", identity.Owner); err != nil {
		t.Errorf("the creator may not do what an owner does: %v", err)
	}
	p.c.Config.Quotas.OwnedProjects = 2
	_, err = p.c.CreateOwnProject(ctx, "third")
	wantKind(t, "past the quota", err, dbcloud.KindConflict, "the most one person may")
	_, err = p.c.CreateOwnProject(cloud.NewContextWithPrincipal(t.Context(), mustKey(t, p)), "by key")
	wantKind(t, "a key", err, dbcloud.KindForbidden, "Only a signed-in person")
}

func mustKey(t *testing.T, p *people) *dbcloud.Principal {
	t.Helper()
	pr, err := p.c.Authenticate(t.Context(), p.boot.Key.AccessKey, p.boot.Key.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	return pr
}

func TestCloud_KeyLastUsed(t *testing.T) {
	p := newPeople(t)
	lastUsed := func() *time.Time {
		t.Helper()
		ks, err := p.c.ProjectAPIKeys(p.owner(t), p.boot.Project.ID)
		if err != nil || len(ks) != 1 {
			t.Fatalf("keys: %v %+v", err, ks)
		}
		return ks[0].LastUsed
	}
	if got := lastUsed(); got != nil {
		t.Fatalf("a new key was used at %v", got)
	}
	first := p.clock
	mustKey(t, p)
	if got := lastUsed(); got == nil || !got.Equal(first) {
		t.Fatalf("after a use: last used %v, want %v", got, first)
	}
	// Within the interval nothing is written; after it the next use is.
	p.clock = first.Add(cloud.KeyUseInterval - time.Second)
	mustKey(t, p)
	if got := lastUsed(); !got.Equal(first) {
		t.Errorf("a use within %v was written: %v", cloud.KeyUseInterval, got)
	}
	p.clock = first.Add(cloud.KeyUseInterval)
	mustKey(t, p)
	if got := lastUsed(); !got.Equal(p.clock) {
		t.Errorf("a use after %v: last used %v, want %v", cloud.KeyUseInterval, got, p.clock)
	}
}
