package local

import (
	"context"
	"testing"

	"dbcloud/internal/pgtest"

	"github.com/jackc/pgx/v5"

	"dbcloud"
)

// TestGuard_ThroughPooler: the guard holds for sessions PgBouncer opens
// for its clients. The reproduction through the pooler is refused
// (42501); a role with tsdb_admin.read_only_role cannot write through it,
// whatever it sets first (each statement may land on another server
// connection, and every one of them is that role's and read-only); and a
// client asking the pooler for a read-only connection never gets a
// session that writes.
func TestGuard_ThroughPooler(t *testing.T) {
	ctx := context.Background()
	f := mustPooler(t, dbcloud.SharedSize)
	direct, err := pgx.Connect(ctx, f.dsn("tsdbadmin", f.password, "tsdb", f.svc.Endpoint.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	for _, sql := range []string{
		"CREATE TABLE ro_t(i int)",
		"INSERT INTO ro_t VALUES (0)",
		"CREATE ROLE ro_user LOGIN PASSWORD 'ro-password-1'",
		"ALTER ROLE ro_user SET tsdb_admin.read_only_role = true",
		"GRANT ALL ON ro_t TO ro_user",
	} {
		if _, err := direct.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	admin, err := f.connect(ctx, "tsdbadmin", f.password, "tsdb")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, sql := range []string{
		"GRANT pg_execute_server_program, pg_read_server_files TO tsdbadmin",
		"COPY ro_t FROM PROGRAM 'id'",
	} {
		if _, err := admin.Exec(ctx, sql); pgtest.SQLState(err) != "42501" {
			t.Errorf("through the pooler, %s: got %v, want 42501", sql, err)
		}
	}

	ro, err := f.connect(ctx, "ro_user", "ro-password-1", "tsdb")
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close(ctx)
	for _, escape := range []string{
		"",
		"SET default_transaction_read_only = off",
		"SET tsdb_admin.read_only_role = off",
		"SELECT set_config('default_transaction_read_only', 'off', false)",
		"BEGIN READ WRITE; INSERT INTO ro_t VALUES (1); COMMIT",
		"DISCARD ALL",
	} {
		if escape != "" {
			_, err := ro.Exec(ctx, escape)
			t.Logf("%s -> %v", escape, err)
			_, _ = ro.Exec(ctx, "ROLLBACK")
		}
		for range 3 { // over whichever server connections the pooler picks
			if _, err := ro.Exec(ctx, "INSERT INTO ro_t VALUES (1)"); pgtest.SQLState(err) != "25006" {
				t.Errorf("after %q, a read-only role's INSERT through the pooler: got %v, want 25006", escape, err)
			}
		}
	}

	// tiger-cli's read-only connection string, to the pooler.
	c, err := pgx.Connect(ctx, f.dsn("tsdbadmin", f.password, "tsdb", f.port)+" options='-c tsdb_admin.read_only_connection=true'")
	if err != nil {
		t.Logf("the pooler refuses the read-only startup option: %v", err)
	} else {
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "INSERT INTO ro_t VALUES (1)"); pgtest.SQLState(err) != "25006" {
			t.Errorf("a read-only connection through the pooler wrote: %v", err)
		}
	}

	var n int
	if err := direct.QueryRow(ctx, "SELECT count(*) FROM ro_t").Scan(&n); err != nil || n != 1 {
		t.Errorf("ro_t has %d rows (%v), want 1", n, err)
	}
}
