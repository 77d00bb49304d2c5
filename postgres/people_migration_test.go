package postgres_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"dbcloud/cloud"

	_ "github.com/jackc/pgx/v5/stdlib"

	"dbcloud"
	"dbcloud/identity"
)

// TestMigratePeople upgrades a store made before users and roles: the
// first user becomes owner of every project, and an existing key keeps
// its power as an owner key (as sqlite's test of the same migration).
func TestMigratePeople(t *testing.T) {
	dsn := mustCreateDatabase(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatalf("%.60s: %v", q, err)
		}
	}
	exec(`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied TEXT NOT NULL)`)
	for i, f := range []string{"0001_initial.sql", "0002_leases.sql"} {
		b, err := os.ReadFile(filepath.Join("migrations", f))
		if err != nil {
			t.Fatal(err)
		}
		exec(string(b))
		exec(`INSERT INTO schema_migrations VALUES ($1, '2026-01-01T00:00:00.000000000Z')`, i+1)
	}
	const ts = "2026-01-01T00:00:00.000000000Z"
	exec(`INSERT INTO users VALUES ('admin00001', $1, $2)`, ts, `{"id":"admin00001","name":"admin","email":"Admin@example.com","created":"`+ts+`"}`)
	exec(`INSERT INTO projects VALUES ('proj000001', $1, $2)`, ts, `{"id":"proj000001","name":"default","plan_type":"self-hosted","created":"`+ts+`"}`)
	exec(`INSERT INTO api_keys VALUES ('dbcOLDKEY', 'proj000001', $1, $2, $3)`, ts, dbcloud.HashSecret("old-secret"),
		`{"access_key":"dbcOLDKEY","project_id":"proj000001","user_id":"admin00001","name":"bootstrap","created":"`+ts+`"}`)
	db.Close()

	s := MustOpen(t, dsn)
	c := cloud.New(s, nil, cloud.DefaultConfig(), nil)
	p, err := c.Authenticate(context.Background(), "dbcOLDKEY", "old-secret")
	if err != nil {
		t.Fatalf("the old key after the migration: %v", err)
	}
	if role, _ := p.RoleIn("proj000001"); role != identity.Owner || p.Key.Role != identity.Owner {
		t.Errorf("old key's role %q (key %q), want owner", role, p.Key.Role)
	}
}
