package storetest

import (
	"testing"
	"time"

	"dbcloud"
	"dbcloud/identity"
)

func testMembership(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	m1 := &dbcloud.Membership{ProjectID: "p1", UserID: "u1", Role: identity.Owner, Created: at(1)}
	m2 := &dbcloud.Membership{ProjectID: "p1", UserID: "u2", Role: identity.Viewer, Created: at(2)}
	m3 := &dbcloud.Membership{ProjectID: "p2", UserID: "u1", Role: identity.Admin, Created: at(0)}
	insert(t, s, dbcloud.Tx.InsertMembership, m2, m1, m3)
	u := newUser("u1", at(1))
	insert(t, s, dbcloud.Tx.InsertUser, u)

	t.Run("OK", func(t *testing.T) {
		equal(t, "FindMembership", view(t, s, func(tx dbcloud.Tx) (*dbcloud.Membership, error) { return tx.FindMembership("p1", "u2") }), m2)
		equal(t, "ListMembers", view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Membership, error) { return tx.ListMembers("p1") }), []*dbcloud.Membership{m1, m2})
		equal(t, "ListMemberships", view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Membership, error) { return tx.ListMemberships("u1") }), []*dbcloud.Membership{m3, m1})
		// E-mail lookup ignores case; the password hash makes the round trip.
		equal(t, "FindUserByEmail", view(t, s, func(tx dbcloud.Tx) (*dbcloud.User, error) { return tx.FindUserByEmail("U1@Example.COM") }), u)
	})
	t.Run("Update", func(t *testing.T) {
		m := *m2
		m.Role = identity.Developer
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.UpdateMembership(&m) })
		equal(t, "after update", view(t, s, func(tx dbcloud.Tx) (*dbcloud.Membership, error) { return tx.FindMembership("p1", "u2") }), &m)
		u2 := *u
		u2.Email, u2.PasswordHash = "new@example.com", "other"
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.UpdateUser(&u2) })
		equal(t, "user after update", view(t, s, func(tx dbcloud.Tx) (*dbcloud.User, error) { return tx.FindUserByEmail("new@example.com") }), &u2)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertMembership(m1) })
		wantDuplicate(t, "InsertMembership", err)
		dup := newUser("u9", at(3))
		dup.Email = "U2@example.com"
		insert(t, s, dbcloud.Tx.InsertUser, newUser("u2", at(2)))
		err = update(t, s, func(tx dbcloud.Tx) error { return tx.InsertUser(dup) })
		wantDuplicate(t, "InsertUser with an e-mail in use", err)
	})
	t.Run("Delete", func(t *testing.T) {
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.DeleteMembership("p2", "u1") })
		err := s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindMembership("p2", "u1")
			return err
		})
		wantNotFound(t, "FindMembership after delete", err)
		wantNotFound(t, "DeleteMembership again", update(t, s, func(tx dbcloud.Tx) error { return tx.DeleteMembership("p2", "u1") }))
	})
}

func testUserToken(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	tok := func(secret, family string, expires time.Time) *dbcloud.UserToken {
		return &dbcloud.UserToken{Hash: dbcloud.HashToken(secret), Kind: dbcloud.TokenCode, UserID: "u1", Family: family,
			ClientID: "cli", Created: at(0), Expires: expires, RedirectURI: "http://127.0.0.1:1/callback", Challenge: "ch", CSRF: "c"}
	}
	a, b, c := tok("a", "f1", at(10)), tok("b", "f1", at(20)), tok("c", "f2", at(5))
	insert(t, s, dbcloud.Tx.InsertUserToken, b, a, c)
	t.Run("OK", func(t *testing.T) {
		equal(t, "FindUserToken", view(t, s, func(tx dbcloud.Tx) (*dbcloud.UserToken, error) { return tx.FindUserToken(dbcloud.HashToken("b")) }), b)
		equal(t, "ListTokenFamily", view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.UserToken, error) { return tx.ListTokenFamily("f1") }), []*dbcloud.UserToken{a, b})
		equal(t, "ListUserTokens", view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.UserToken, error) { return tx.ListUserTokens("u1") }), []*dbcloud.UserToken{c, a, b})
	})
	t.Run("Update", func(t *testing.T) {
		x := *a
		x.Used, x.Revoked = ptr(at(3)), ptr(at(4))
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.UpdateUserToken(&x) })
		equal(t, "after update", view(t, s, func(tx dbcloud.Tx) (*dbcloud.UserToken, error) { return tx.FindUserToken(x.Hash) }), &x)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		wantDuplicate(t, "InsertUserToken", update(t, s, func(tx dbcloud.Tx) error { return tx.InsertUserToken(tok("a", "f9", at(1))) }))
	})
	t.Run("DeleteBefore", func(t *testing.T) {
		var n int
		MustUpdate(t, s, func(tx dbcloud.Tx) (err error) {
			n, err = tx.DeleteUserTokensBefore(at(15))
			return err
		})
		if n != 2 {
			t.Errorf("deleted %d tokens, want 2", n)
		}
		err := s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindUserToken(dbcloud.HashToken("c"))
			return err
		})
		wantNotFound(t, "FindUserToken after purge", err)
	})
}
