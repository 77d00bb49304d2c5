package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/internal/pgtest"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"
)

// TestPooler_Auth: the pooler admits tenant roles only, whatever a tenant
// builds in the databases it may create, and its sign-in lookup leaves no
// session behind in the database the client named.
func TestPooler_Auth(t *testing.T) {
	f := mustPooler(t, dbcloud.SharedSize)
	ctx := context.Background()
	direct := f.mustDirect(t, "tsdb")

	// The reproduction: in a database of its own, tsdbadmin writes
	// a pgbouncer.get_auth that vouches for a password it chose, for any
	// role, then signs in through the pooler as dbcloud's replication role
	// (which PostgreSQL lets in by the peer identity PgBouncer has) and
	// takes a replication slot that keeps WAL without bound.
	t.Run("ForeignLookupCannotAdmitReplicator", func(t *testing.T) {
		if _, err := direct.Exec(ctx, `CREATE DATABASE hijack TEMPLATE template0`); err != nil {
			t.Fatal(err)
		}
		hijack := f.mustDirect(t, "hijack")
		verifier := dbcloud.NewSCRAMVerifier("chosen-by-tenant")
		if _, err := hijack.Exec(ctx, `CREATE SCHEMA pgbouncer; GRANT USAGE ON SCHEMA pgbouncer TO PUBLIC;
			CREATE FUNCTION pgbouncer.get_auth(p text) RETURNS TABLE (usename name, passwd text)
			LANGUAGE sql AS $$ SELECT p::name, '`+verifier+`'::text $$`); err != nil {
			t.Fatal(err)
		}
		for _, role := range []string{postgres.ReplicatorRole, postgres.PoolerRole, "postgres"} {
			c, err := f.connect(ctx, role, "chosen-by-tenant", "hijack")
			if err != nil {
				t.Logf("%s through the pooler: %v", role, err)
				continue
			}
			var slot string
			err = c.QueryRow(ctx, `SELECT slot_name::text FROM pg_create_physical_replication_slot('x', true)`).Scan(&slot)
			c.Close(ctx)
			t.Errorf("signed in through the pooler as %s with a tenant's lookup; replication slot: %q, %v", role, slot, err)
		}
	})

	// Reserved names are refused by name, in any case and with spaces
	// around, even when a role of that name exists with a password the
	// client knows (the superuser makes them here: the guard keeps tenants
	// from it, but a service may hold one from before).
	t.Run("ReservedNamesRefused", func(t *testing.T) {
		const pw = "reserved-name-1"
		verifier := dbcloud.NewSCRAMVerifier(pw)
		for _, role := range []string{"Postgres", "postgres ", "DBCLOUD_REPLICATOR", "Dbcloud_Pooler", "dbcloud_x"} {
			sql := `CREATE ROLE ` + postgres.QuoteIdent(role) + ` LOGIN PASSWORD '` + verifier + `'`
			if err := f.rt.instances.Exec(ctx, f.spec, "postgres", sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		for _, role := range []string{"Postgres", "postgres ", "DBCLOUD_REPLICATOR", "Dbcloud_Pooler", "dbcloud_x"} {
			mustFailLogin(t, f, role, pw, "tsdb", "reserved name with a known password")
		}
		for _, role := range []string{"postgres", postgres.PoolerRole, postgres.ReplicatorRole, "pg_monitor", "pg_read_all_data"} {
			mustFailLogin(t, f, role, pw, "tsdb", "reserved role")
		}
		// A tenant role still signs in.
		f.mustQueryThrough(t, f.password)
	})

	// A failed sign-in to template1 left the lookup role's session there
	// (PgBouncer keeps its lookup connection pooled), and the tenant's next
	// CREATE DATABASE failed: "source database "template1" is being
	// accessed by other users".
	t.Run("Template1NotHeld", func(t *testing.T) {
		mustFailLogin(t, f, "tsdbadmin", "wrong-password", "template1", "wrong password to template1")
		var held int
		if err := superQueryRow(ctx, f.rt.instances, f.spec, "postgres",
			`SELECT count(*) FROM pg_stat_activity WHERE datname = 'template1'`, &held); err != nil {
			t.Fatal(err)
		}
		if held != 0 {
			t.Errorf("%d sessions on template1 after a failed pooler sign-in", held)
		}
		if _, err := direct.Exec(ctx, `CREATE DATABASE after_template1`); err != nil {
			t.Errorf("CREATE DATABASE after a failed pooler sign-in to template1: %v", err)
		}
	})

	// The lookup lives in a database of dbcloud's that no tenant reaches.
	t.Run("AuthDatabaseOutOfReach", func(t *testing.T) {
		db := postgres.PoolerDatabase
		var owner string
		var definer bool
		err := superQueryRow(ctx, f.rt.instances, f.spec, db, `SELECT pg_get_userbyid(p.proowner)::text, p.prosecdef
			FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgbouncer' AND p.proname = 'get_auth'`, &owner, &definer)
		if err != nil || owner != "postgres" || !definer {
			t.Errorf("get_auth in %s: owner %q, security definer %v, %v", db, owner, definer, err)
		}
		if c, err := pgx.Connect(ctx, f.dsn("tsdbadmin", f.password, db, f.svc.Endpoint.Port)); err == nil {
			c.Close(ctx)
			t.Errorf("tsdbadmin connected to %s directly", db)
		}
		mustFailLogin(t, f, "tsdbadmin", f.password, db, "the lookup's database through the pooler")
		for _, sql := range []string{
			`DROP DATABASE ` + db,
			`ALTER DATABASE ` + db + ` RENAME TO mine`,
			`ALTER DATABASE ` + db + ` OWNER TO tsdbadmin`,
			`ALTER DATABASE ` + db + ` SET search_path = public`,
		} {
			if _, err := direct.Exec(ctx, sql); pgtest.SQLState(err) != "42501" {
				t.Errorf("tsdbadmin: %s: %v, want 42501", sql, err)
			}
		}
		// GRANT without the right to grant only warns; nothing changes.
		_, _ = direct.Exec(ctx, `GRANT CONNECT ON DATABASE `+db+` TO tsdbadmin`)
		var can bool
		if err := direct.QueryRow(ctx, `SELECT has_database_privilege('tsdbadmin', $1, 'CONNECT')`, db).Scan(&can); err != nil || can {
			t.Errorf("tsdbadmin may connect to %s: %v, %v", db, can, err)
		}
		// Ensuring again changes nothing and keeps the pooler serving.
		if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		f.mustQueryThrough(t, f.password)
	})

	// PgBouncer's HBA refuses dbcloud's roles by name even should the
	// lookup answer for them (replaced by hand as the superuser here); the
	// next ensure puts the real lookup back.
	t.Run("HBARefusesPlatformRoles", func(t *testing.T) {
		const pw = "vouched-1"
		verifier := dbcloud.NewSCRAMVerifier(pw)
		if err := f.rt.instances.Exec(ctx, f.spec, postgres.PoolerDatabase, `CREATE OR REPLACE FUNCTION pgbouncer.get_auth(p_usename text)
			RETURNS TABLE (usename name, passwd text) LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
			AS $$ SELECT p_usename::name, '`+verifier+`'::text $$`); err != nil {
			t.Fatal(err)
		}
		for _, role := range []string{"postgres", postgres.PoolerRole, postgres.ReplicatorRole} {
			mustFailLogin(t, f, role, pw, "tsdb", "platform role vouched for by the lookup")
		}
		if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		mustFailLogin(t, f, "tsdbadmin", pw, "tsdb", "the real lookup is back")
		f.mustQueryThrough(t, f.password)
	})

	// A service from before: the lookup's copies in template1 and tsdb
	// (as earlier versions installed them), no lookup database. The ensure
	// that makes the database drops those copies, and leaves a tenant's
	// own schema pgbouncer alone.
	t.Run("OldCopiesDropped", func(t *testing.T) {
		if _, err := direct.Exec(ctx, `CREATE DATABASE ownschema TEMPLATE template0`); err != nil {
			t.Fatal(err)
		}
		if _, err := f.mustDirect(t, "ownschema").Exec(ctx, `CREATE SCHEMA pgbouncer`); err != nil {
			t.Fatal(err)
		}
		const oldLookup = `CREATE SCHEMA pgbouncer AUTHORIZATION postgres;
			CREATE FUNCTION pgbouncer.get_auth(p_usename text) RETURNS TABLE (usename name, passwd text)
			LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
			AS $$ SELECT usename, passwd FROM pg_catalog.pg_shadow WHERE usename = p_usename $$`
		for _, db := range []string{"template1", "tsdb"} {
			if err := f.rt.instances.Exec(ctx, f.spec, db, oldLookup); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.rt.instances.Exec(ctx, f.spec, "postgres", `DROP DATABASE `+postgres.PoolerDatabase+` WITH (FORCE)`); err != nil {
			t.Fatal(err)
		}
		if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		for db, want := range map[string]int{"template1": 0, "tsdb": 0, "ownschema": 1, postgres.PoolerDatabase: 1} {
			var n int
			if err := superQueryRow(ctx, f.rt.instances, f.spec, db, `SELECT count(*) FROM pg_namespace WHERE nspname = 'pgbouncer'`, &n); err != nil || n != want {
				t.Errorf("schema pgbouncer in %s: %d, %v; want %d", db, n, err, want)
			}
		}
		f.mustQueryThrough(t, f.password)
	})

	// A pooler another PgBouncer runs (one from before an upgrade) is
	// restarted onto the binary this runtime found, not merely reloaded.
	t.Run("NewBinaryRestarts", func(t *testing.T) {
		other := filepath.Join(filepath.Dir(f.cfg.DataDir), "bin", "pgbouncer")
		if err := os.MkdirAll(filepath.Dir(other), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(f.rt.poolers.Binary())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(other, data, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg := f.cfg
		cfg.PgBouncer = other
		rt2, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer rt2.Close()
		if _, err := rt2.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		pid := f.pid(t)
		if exe := proc.Exe(pid); exe != other {
			t.Fatalf("pooler runs %s, want %s", exe, other)
		}
		if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		if got := f.pid(t); got == pid || proc.Exe(got) != f.rt.poolers.Binary() {
			t.Errorf("after an ensure with %s: pid %d -> %d running %s", f.rt.poolers.Binary(), pid, got, proc.Exe(got))
		}
		f.mustQueryThrough(t, f.password)
	})
}

// mustDirect connects as tsdbadmin to db on the service's own endpoint,
// bypassing the pooler, and closes the connection when the test ends.
func (f *poolerFixture) mustDirect(tb testing.TB, db string) *pgx.Conn {
	tb.Helper()
	c, err := pgx.Connect(context.Background(), f.dsn("tsdbadmin", f.password, db, f.svc.Endpoint.Port))
	if err != nil {
		tb.Fatalf("connect directly to %s: %v", db, err)
	}
	tb.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TestPooler_AuthDatabaseTaken: a tenant's own database under the lookup
// database's name (made before dbcloud reserved it) is never used for the
// lookup: the pooler is refused with a reason the tenant can act on.
func TestPooler_AuthDatabaseTaken(t *testing.T) {
	f := mustPooler(t, dbcloud.SharedSize)
	ctx := context.Background()
	f.svc.Spec.Pooler = false
	if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
		t.Fatal(err)
	}
	db := postgres.PoolerDatabase
	if err := f.rt.instances.Exec(ctx, f.spec, "postgres", `DROP DATABASE `+db+` WITH (FORCE)`); err != nil {
		t.Fatal(err)
	}
	// The guard refuses the name to tenants now: made as the tenant could
	// before, by the superuser on its behalf and given to it.
	if err := f.rt.instances.Exec(ctx, f.spec, "postgres", `CREATE DATABASE `+db+` OWNER tsdbadmin`); err != nil {
		t.Fatal(err)
	}
	direct := f.mustDirect(t, "tsdb")
	if _, err := direct.Exec(ctx, `CREATE DATABASE `+db+`2`); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Exec(ctx, `ALTER DATABASE `+db+`2 RENAME TO `+db+`3`); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Exec(ctx, `ALTER DATABASE `+db+`3 RENAME TO `+db); pgtest.SQLState(err) != "42501" {
		t.Fatalf("tsdbadmin renaming a database to %s: %v, want the guard's 42501", db, err)
	}
	f.svc.Spec.Pooler = true
	_, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port)
	var derr *dbcloud.Error
	if !errors.As(err, &derr) || derr.Kind != dbcloud.KindConflict || !strings.Contains(derr.Message, db) {
		t.Fatalf("ensure with a tenant's %s database: %v, want a conflict naming it", db, err)
	}
	t.Logf("refused: %v", err)
	if f.rt.poolerRunning(f.svc.ID) {
		t.Error("the pooler runs with a tenant's lookup database")
	}
}
