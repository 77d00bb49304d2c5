package storetest

import (
	"testing"
	"time"

	"dbcloud"
)

func newCredential(projectID, serviceID, id string, created time.Time) *dbcloud.Credential {
	return &dbcloud.Credential{
		ID: id, ProjectID: projectID, ServiceID: serviceID, Name: "reader " + id,
		Access: dbcloud.CredentialReadOnly, Verifier: "SCRAM-SHA-256$4096:c2FsdA==$a2V5:c2VydmVy",
		Created: created, Expires: created.Add(time.Hour),
		CreatedBy: dbcloud.Requester{AccessKey: "dbcabc", UserEmail: "a@example.com"},
	}
}

func testCredential(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	c1, c2, c3, c4 := newCredential("p1", "s1", "c1", at(2)), newCredential("p1", "s1", "c2", at(1)),
		newCredential("p1", "s2", "c3", at(0)), newCredential("p2", "s1", "c4", at(3))
	c2.Access = dbcloud.CredentialReadWrite
	insert(t, s, dbcloud.Tx.InsertCredential, c1, c2, c3, c4)
	find := func(p, svc, id string) func(dbcloud.Tx) (*dbcloud.Credential, error) {
		return func(tx dbcloud.Tx) (*dbcloud.Credential, error) { return tx.FindCredential(p, svc, id) }
	}
	list := func(p, svc string) func(dbcloud.Tx) ([]*dbcloud.Credential, error) {
		return func(tx dbcloud.Tx) ([]*dbcloud.Credential, error) { return tx.ListCredentials(p, svc) }
	}

	t.Run("OK", func(t *testing.T) {
		equal(t, "FindCredential", view(t, s, find("p1", "s1", "c2")), c2)
		equal(t, "ListCredentials(p1, s1)", view(t, s, list("p1", "s1")), []*dbcloud.Credential{c2, c1})
		equal(t, "ListCredentials(p1)", view(t, s, list("p1", "")), []*dbcloud.Credential{c3, c2, c1})
		equal(t, "ListCredentials(all)", view(t, s, list("", "")), []*dbcloud.Credential{c3, c2, c1, c4})
	})
	t.Run("Update", func(t *testing.T) {
		revoked := at(5)
		c1.Revoked = &revoked
		insert(t, s, dbcloud.Tx.UpdateCredential, c1)
		equal(t, "FindCredential after update", view(t, s, find("p1", "s1", "c1")), c1)
	})
	t.Run("Delete", func(t *testing.T) {
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.DeleteCredential("p1", "s2", "c3") })
		equal(t, "ListCredentials after delete", view(t, s, list("p1", "s2")), []*dbcloud.Credential{})
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindCredential("p2", "s1", "c1")
			wantNotFound(t, "FindCredential of another project", err)
			_, err = tx.FindCredential("p1", "s2", "c1")
			wantNotFound(t, "FindCredential of another service", err)
			return nil
		})
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.UpdateCredential(newCredential("p2", "s1", "c1", at(1))) })
		wantNotFound(t, "UpdateCredential of another project", err)
		err = update(t, s, func(tx dbcloud.Tx) error { return tx.DeleteCredential("p1", "s1", "c9") })
		wantNotFound(t, "DeleteCredential", err)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertCredential(newCredential("p1", "s1", "c2", at(1))) })
		wantDuplicate(t, "InsertCredential", err)
	})
}
