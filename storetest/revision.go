package storetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/identity"
)

// testRevision checks the change counters (dbcloud.Revisions): every write
// to what a scope covers grows its counter once per transaction, and
// nothing else does: not a read, not a write that is rolled back, not a
// write to another project, and a service's own counter not a write to
// another service.
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
	s1, s2 := dbcloud.RevisionService("p1", "s1"), dbcloud.RevisionService("p2", "s2")
	if got := rev(creds) + rev(p1); got != 0 {
		t.Fatalf("counters of an empty store: %d, want 0", got)
	}
	// grows runs fn in an Update and checks which counters grew by one.
	grows := func(name string, fn func(tx dbcloud.Tx) error, want ...string) {
		t.Helper()
		before := map[string]int64{creds: rev(creds), p1: rev(p1), p2: rev(p2), s1: rev(s1), s2: rev(s2)}
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
	grows("InsertService", func(tx dbcloud.Tx) error { return tx.InsertService(svc) }, p1, s1)
	grows("UpdateService twice", func(tx dbcloud.Tx) error {
		svc.Name = "renamed"
		if err := tx.UpdateService(svc); err != nil {
			return err
		}
		return tx.UpdateService(svc)
	}, p1, s1)
	other := NewService("p1", "s9", at(1))
	grows("InsertService of another", func(tx dbcloud.Tx) error { return tx.InsertService(other) }, p1)
	grows("UpdateService of another", func(tx dbcloud.Tx) error { other.Name = "other"; return tx.UpdateService(other) }, p1)
	grows("InsertReplicaSet", func(tx dbcloud.Tx) error { return tx.InsertReplicaSet(newReplicaSet("p1", "s1", "r1", at(2))) }, p1, s1)
	grows("UpdateReplicaSet", func(tx dbcloud.Tx) error {
		r, err := tx.FindReplicaSet("p1", "r1")
		if err != nil {
			return err
		}
		r.Name = "renamed"
		return tx.UpdateReplicaSet(r)
	}, p1, s1)
	grows("DeleteReplicaSet", func(tx dbcloud.Tx) error { return tx.DeleteReplicaSet("p1", "r1") }, p1, s1)
	grows("InsertService in p2", func(tx dbcloud.Tx) error { return tx.InsertService(NewService("p2", "s2", at(1))) }, p2, s2)
	grows("DeleteService", func(tx dbcloud.Tx) error { return tx.DeleteService("p1", "s1") }, p1, s1)
	grows("InsertProject", func(tx dbcloud.Tx) error { return tx.InsertProject(newProject("p1", at(0))) }, creds)
	grows("InsertUser", func(tx dbcloud.Tx) error { return tx.InsertUser(newUser("user1", at(0))) }, creds)
	grows("InsertMembership", func(tx dbcloud.Tx) error {
		return tx.InsertMembership(&dbcloud.Membership{ProjectID: "p1", UserID: "user1", Role: identity.Owner, Created: at(1)})
	}, creds)
	key := newAPIKey("p1", "AK1", at(1))
	grows("InsertAPIKey", func(tx dbcloud.Tx) error { return tx.InsertAPIKey(key) }, creds)
	grows("UpdateAPIKey", func(tx dbcloud.Tx) error { key.Name = "revoked"; return tx.UpdateAPIKey(key) }, creds)
	// A key's last use is no credential: recording it keeps every
	// verified key verified.
	grows("TouchAPIKey", func(tx dbcloud.Tx) error { return tx.TouchAPIKey("AK1", at(9)) })
	grows("InsertInvitation", func(tx dbcloud.Tx) error { return tx.InsertInvitation(newInvitation("p1", "i1", "t", at(1))) })
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

// testRevisionElsewhere checks the counters a store keeps in memory
// against commits made elsewhere: a second store over the same database
// (another control plane on PostgreSQL, `dbcloud admin` on SQLite). The
// first store's own commit shows at once; the other's shows within a
// deadline (on PostgreSQL it arrives as a notification), also after the
// first store answered the same counters many times from memory.
func testRevisionElsewhere(t *testing.T, newDB NewDB) {
	open := newDB(t)
	a, b := open(t), open(t)
	revsOf := func(s dbcloud.Store) dbcloud.Revisions {
		r, ok := dbcloud.UnwrapStore(s).(dbcloud.Revisions)
		if !ok {
			t.Fatalf("%T keeps no change counters", s)
		}
		return r
	}
	ra := revsOf(a)
	creds, p1 := dbcloud.RevisionCredentials, dbcloud.RevisionServices("p1")
	read := func() [2]int64 {
		t.Helper()
		n, err := ra.Revisions(t.Context(), creds, p1)
		if err != nil {
			t.Fatalf("Revisions: %v", err)
		}
		return [2]int64{n[0], n[1]}
	}
	// seen waits until a reads want, asking as a busy API would.
	seen := func(what string, want [2]int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		got := read()
		for got != want && time.Now().Before(deadline) {
			for range 100 {
				got = read()
			}
			time.Sleep(time.Millisecond)
		}
		if got != want {
			t.Fatalf("%s: counters (credentials, services/p1) read %v on the first store, want %v", what, got, want)
		}
	}
	for i := range 3 {
		read() // kept
		MustUpdate(t, a, func(tx dbcloud.Tx) error {
			return tx.InsertService(NewService("p1", fmt.Sprintf("own%d", i), at(i)))
		})
		if got := read(); got[1] != int64(2*i+1) {
			t.Fatalf("own commit %d: services/p1 reads %d right after it, want %d", i, got[1], 2*i+1)
		}
		for range 100 {
			read()
		}
		MustUpdate(t, b, func(tx dbcloud.Tx) error {
			return tx.InsertService(NewService("p1", fmt.Sprintf("other%d", i), at(i)))
		})
		seen(fmt.Sprintf("the other store's commit %d", i), [2]int64{0, int64(2*i + 2)})
	}
	MustUpdate(t, b, func(tx dbcloud.Tx) error { return tx.InsertProject(newProject("p1", at(1))) })
	seen("the other store's new project", [2]int64{1, 6})
}

// RevisionsFromMemory checks that s answers its change counters without
// a connection of pool, the pool its reads use: every connection is held
// by an open transaction, as under a load that queues for them, and
// Revisions must still answer (once s has read the counters, or on
// PostgreSQL once it follows them), with what the commits through s
// left, also those after it read them: a store's own writes must not send
// the reads after them to the database.
func RevisionsFromMemory(t *testing.T, s dbcloud.Store, pool *sql.DB) {
	revs, ok := dbcloud.UnwrapStore(s).(dbcloud.Revisions)
	if !ok {
		t.Fatalf("%T keeps no change counters", s)
	}
	p1 := dbcloud.RevisionServices("p1")
	MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.InsertService(NewService("p1", "s1", at(1))) })
	if _, err := revs.Revisions(t.Context(), p1); err != nil {
		t.Fatalf("Revisions: %v", err)
	}
	// A write that moves the counter, and one that moves none.
	MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.InsertService(NewService("p1", "s2", at(2))) })
	MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.InsertInvitation(newInvitation("p1", "i1", "t", at(1))) })
	for range pool.Stats().MaxOpenConnections {
		tx, err := pool.BeginTx(t.Context(), &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatalf("hold a connection: %v", err)
		}
		// A statement, so that the transaction has begun on the server.
		if _, err := tx.ExecContext(t.Context(), `SELECT 1`); err != nil {
			t.Fatalf("hold a connection: %v", err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		got, err := revs.Revisions(ctx, p1)
		cancel()
		if err == nil {
			if got[0] != 2 {
				t.Errorf("Revisions(services/p1) = %d from memory, want 2", got[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Revisions with every connection of the pool taken: %v; want the counters kept in memory", err)
		}
	}
}
