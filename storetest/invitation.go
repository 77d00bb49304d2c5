package storetest

import (
	"testing"
	"time"

	"dbcloud"
	"dbcloud/identity"
)

func newInvitation(projectID, id, token string, created time.Time) *dbcloud.Invitation {
	return &dbcloud.Invitation{ID: id, ProjectID: projectID, Email: id + "@example.com", Role: identity.Developer,
		InvitedBy: "u1", Hash: dbcloud.HashToken(token), Created: created, Expires: created.Add(dbcloud.InvitationTTL)}
}

func testInvitation(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	a, b, c := newInvitation("p1", "i1", "ta", at(2)), newInvitation("p1", "i2", "tb", at(1)), newInvitation("p2", "i3", "tc", at(0))
	insert(t, s, dbcloud.Tx.InsertInvitation, a, b, c)
	find := func(p, id string) func(dbcloud.Tx) (*dbcloud.Invitation, error) {
		return func(tx dbcloud.Tx) (*dbcloud.Invitation, error) { return tx.FindInvitation(p, id) }
	}
	byHash := func(token string) func(dbcloud.Tx) (*dbcloud.Invitation, error) {
		return func(tx dbcloud.Tx) (*dbcloud.Invitation, error) {
			return tx.FindInvitationByHash(dbcloud.HashToken(token))
		}
	}

	t.Run("OK", func(t *testing.T) {
		equal(t, "FindInvitation", view(t, s, find("p1", "i2")), b)
		// The hash makes the round trip in its column, not in the doc.
		equal(t, "FindInvitationByHash", view(t, s, byHash("ta")), a)
		equal(t, "ListInvitations", view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Invitation, error) { return tx.ListInvitations("p1") }),
			[]*dbcloud.Invitation{b, a})
	})
	t.Run("Update", func(t *testing.T) {
		x := *a
		x.Accepted, x.AcceptedBy = ptr(at(5)), "u9"
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.UpdateInvitation(&x) })
		equal(t, "after update", view(t, s, byHash("ta")), &x)
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindInvitation("p2", "i1")
			wantNotFound(t, "FindInvitation of another project", err)
			_, err = tx.FindInvitationByHash(dbcloud.HashToken("wrong"))
			wantNotFound(t, "FindInvitationByHash of a wrong token", err)
			return nil
		})
		wantNotFound(t, "UpdateInvitation of another project",
			update(t, s, func(tx dbcloud.Tx) error { return tx.UpdateInvitation(newInvitation("p2", "i1", "tx", at(1))) }))
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		wantDuplicate(t, "InsertInvitation with an ID in use",
			update(t, s, func(tx dbcloud.Tx) error { return tx.InsertInvitation(newInvitation("p1", "i1", "tz", at(1))) }))
		wantDuplicate(t, "InsertInvitation with a token in use",
			update(t, s, func(tx dbcloud.Tx) error { return tx.InsertInvitation(newInvitation("p1", "i9", "tb", at(1))) }))
	})
}

func testAPIKeyLastUsed(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	k := newAPIKey("p1", "k1", at(0))
	insert(t, s, dbcloud.Tx.InsertAPIKey, k)
	find := func(tx dbcloud.Tx) (*dbcloud.APIKey, error) { return tx.FindAPIKey("k1") }
	touch := func(n int) {
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.TouchAPIKey("k1", at(n)) })
	}
	equal(t, "a new key's last use", view(t, s, find).LastUsed, (*time.Time)(nil))
	touch(5)
	want := *k
	want.LastUsed = ptr(at(5))
	equal(t, "after a use", view(t, s, find), &want)
	// An older use recorded late (another control plane) moves nothing back.
	touch(3)
	equal(t, "after an older use", view(t, s, find), &want)
	equal(t, "ListAPIKeys", view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.APIKey, error) { return tx.ListAPIKeys("p1") }), []*dbcloud.APIKey{&want})
	// Revoking the key keeps its last use.
	revoked := want
	revoked.Revoked = ptr(at(7))
	insert(t, s, dbcloud.Tx.UpdateAPIKey, &revoked)
	equal(t, "after revoke", view(t, s, find), &revoked)
}
