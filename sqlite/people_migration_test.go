package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"dbcloud/cloud"

	_ "modernc.org/sqlite"

	"dbcloud"
	"dbcloud/identity"
)

// TestMigratePeople upgrades a store made before users and roles: the
// first user becomes owner of every project, and an existing key keeps
// its power as an owner key.
func TestMigratePeople(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dbcloud.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	db.Exec(`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied TEXT NOT NULL)`)
	for i, f := range []string{"0001_initial.sql", "0002_leases.sql"} {
		b, err := os.ReadFile(filepath.Join("migrations", f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(string(b)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		db.Exec(`INSERT INTO schema_migrations VALUES (?, '2026-01-01T00:00:00.000000000Z')`, i+1)
	}
	// What a version-2 store held: the admin user, two projects, a key.
	const ts = "2026-01-01T00:00:00.000000000Z"
	for _, q := range []string{
		`INSERT INTO users VALUES ('admin00001', '` + ts + `', '{"id":"admin00001","name":"admin","email":"Admin@example.com","created":"` + ts + `"}')`,
		`INSERT INTO projects VALUES ('proj000001', '` + ts + `', '{"id":"proj000001","name":"default","plan_type":"self-hosted","created":"` + ts + `"}')`,
		`INSERT INTO projects VALUES ('proj000002', '` + ts + `', '{"id":"proj000002","name":"other","plan_type":"self-hosted","created":"` + ts + `"}')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`INSERT INTO api_keys VALUES ('dbcOLDKEY', 'proj000001', ?, ?, ?)`, ts, dbcloud.HashSecret("old-secret"),
		`{"access_key":"dbcOLDKEY","project_id":"proj000001","user_id":"admin00001","name":"bootstrap","created":"`+ts+`"}`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s := MustOpen(t, path)
	c := cloud.New(s, nil, cloud.DefaultConfig(), nil)
	p, err := c.Authenticate(context.Background(), "dbcOLDKEY", "old-secret")
	if err != nil {
		t.Fatalf("the old key after the migration: %v", err)
	}
	if role, _ := p.RoleIn("proj000001"); role != identity.Owner || p.Key.Role != identity.Owner {
		t.Errorf("old key's role %q (key %q), want owner", role, p.Key.Role)
	}
	err = s.View(context.Background(), func(tx dbcloud.Tx) error {
		ms, err := tx.ListMemberships("admin00001")
		if err != nil {
			return err
		}
		if len(ms) != 2 || ms[0].Role != identity.Owner || ms[1].Role != identity.Owner {
			t.Errorf("the first user's memberships: %+v, want owner of both projects", ms)
		}
		u, err := tx.FindUserByEmail("admin@example.com")
		if err != nil || u.ID != "admin00001" {
			t.Errorf("e-mail lookup after the migration: %v %v", u, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
