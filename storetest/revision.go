package storetest

import (
	"errors"
	"testing"

	"dbcloud"
	"dbcloud/identity"
)

// testRevision checks the change counters (dbcloud.Revisions): every write
// to what a scope covers grows its counter once per transaction, and
// nothing else does: not a read, not a write that is rolled back, not a
// write to another project.
func testRevision(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	revs, ok := dbcloud.UnwrapStore(s).(dbcloud.Revisions)
	if !ok {
		t.Fatalf("%T keeps no change counters", s)
	}
	rev := func(scope string) int64 {
		t.Helper()
		n, err := revs.Revisions(t.Context(), scope)
		if err != nil {
			t.Fatalf("Revisions(%s): %v", scope, err)
		}
		return n[0]
	}
	creds, p1, p2 := dbcloud.RevisionCredentials, dbcloud.RevisionServices("p1"), dbcloud.RevisionServices("p2")
	if got := rev(creds) + rev(p1); got != 0 {
		t.Fatalf("counters of an empty store: %d, want 0", got)
	}
	// grows runs fn in an Update and checks which counters grew by one.
	grows := func(name string, fn func(tx dbcloud.Tx) error, want ...string) {
		t.Helper()
		before := map[string]int64{creds: rev(creds), p1: rev(p1), p2: rev(p2)}
		MustUpdate(t, s, fn)
		for scope, n := range before {
			wantN := n
			for _, w := range want {
				if w == scope {
					wantN++
				}
			}
			if got := rev(scope); got != wantN {
				t.Errorf("%s: counter %s is %d, want %d", name, scope, got, wantN)
			}
		}
	}
	svc := NewService("p1", "s1", at(1))
	grows("InsertService", func(tx dbcloud.Tx) error { return tx.InsertService(svc) }, p1)
	grows("UpdateService twice", func(tx dbcloud.Tx) error {
		svc.Name = "renamed"
		if err := tx.UpdateService(svc); err != nil {
			return err
		}
		return tx.UpdateService(svc)
	}, p1)
	grows("InsertReplicaSet", func(tx dbcloud.Tx) error { return tx.InsertReplicaSet(newReplicaSet("p1", "s1", "r1", at(2))) }, p1)
	grows("DeleteReplicaSet", func(tx dbcloud.Tx) error { return tx.DeleteReplicaSet("p1", "r1") }, p1)
	grows("InsertService in p2", func(tx dbcloud.Tx) error { return tx.InsertService(NewService("p2", "s2", at(1))) }, p2)
	grows("DeleteService", func(tx dbcloud.Tx) error { return tx.DeleteService("p1", "s1") }, p1)
	grows("InsertProject", func(tx dbcloud.Tx) error { return tx.InsertProject(newProject("p1", at(0))) }, creds)
	grows("InsertUser", func(tx dbcloud.Tx) error { return tx.InsertUser(newUser("user1", at(0))) }, creds)
	grows("InsertMembership", func(tx dbcloud.Tx) error {
		return tx.InsertMembership(&dbcloud.Membership{ProjectID: "p1", UserID: "user1", Role: identity.Owner, Created: at(1)})
	}, creds)
	key := newAPIKey("p1", "AK1", at(1))
	grows("InsertAPIKey", func(tx dbcloud.Tx) error { return tx.InsertAPIKey(key) }, creds)
	grows("UpdateAPIKey", func(tx dbcloud.Tx) error { key.Name = "revoked"; return tx.UpdateAPIKey(key) }, creds)
	grows("InsertUserToken", func(tx dbcloud.Tx) error {
		return tx.InsertUserToken(&dbcloud.UserToken{
			Hash: dbcloud.HashToken("t1"), Kind: dbcloud.TokenAccess, UserID: "user1", Family: "f1", Created: at(1), Expires: at(3600),
		})
	}, creds)
	grows("a read", func(tx dbcloud.Tx) error { _, err := tx.ListServices("p1"); return err })

	got, err := revs.Revisions(t.Context(), p2, creds, "nothing")
	if err != nil || len(got) != 3 || got[0] != rev(p2) || got[1] != rev(creds) || got[2] != 0 {
		t.Errorf("Revisions(p2, credentials, nothing) = %v, %v; want %d, %d, 0", got, err, rev(p2), rev(creds))
	}

	before := rev(p2)
	rollback := errors.New("roll back")
	err = s.Update(t.Context(), func(tx dbcloud.Tx) error {
		if err := tx.InsertService(NewService("p2", "s3", at(2))); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("Update: %v, want the error of fn", err)
	}
	if got := rev(p2); got != before {
		t.Errorf("a rolled back write moved the counter from %d to %d", before, got)
	}
}
