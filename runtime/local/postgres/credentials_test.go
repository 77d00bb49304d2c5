package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/internal/pgtest"
)

// syncCredentials does on one instance what the runtime's SyncCredentials
// does on a primary without standbys.
func syncCredentials(t *testing.T, m *Instances, s Spec, want ...CredentialRole) *CredentialChange {
	t.Helper()
	ctx := context.Background()
	conn, err := m.Connect(ctx, s, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	change, err := ApplyCredentials(ctx, conn, want)
	if err != nil {
		t.Fatalf("apply credentials: %v", err)
	}
	if err := m.EndCredentialSessions(ctx, s, append(change.Stale, change.Reshaped...), ""); err != nil {
		t.Fatal(err)
	}
	if err := m.DropCredentials(ctx, s, change.Stale); err != nil {
		t.Fatal(err)
	}
	return change
}

func credential(name, password string, readOnly bool, expires time.Time) CredentialRole {
	return CredentialRole{Name: name, Verifier: dbcloud.NewSCRAMVerifier(password), ReadOnly: readOnly, Expires: expires}
}

// credentialDSN is dsn (tsdbadmin's, over TLS) for another role.
func credentialDSN(dsn, role, password string) string {
	return strings.Replace(dsn, "tsdbadmin:guard-test-password", role+":"+password, 1)
}

// TestCredentials_ReadOnly: a READ_ONLY credential logs in over TLS,
// reads a table tsdbadmin made after it, and every way out of read-only
// (the guard's list, SET ROLE tsdbadmin, SET SESSION AUTHORIZATION, a
// SECURITY DEFINER function of tsdbadmin's that writes) leaves its writes
// refused with 25006.
func TestCredentials_ReadOnly(t *testing.T) {
	ctx := context.Background()
	m, s, dsn := guardInstance(t)
	admin := mustConnect(t, dsn)
	for _, sql := range []string{
		"CREATE TABLE ro_t(i int)",
		"INSERT INTO ro_t VALUES (0)",
		"CREATE SEQUENCE ro_seq",
		"CREATE FUNCTION ro_writer() RETURNS void LANGUAGE sql SET default_transaction_read_only = off AS 'INSERT INTO ro_t VALUES (2)'",
		"CREATE FUNCTION definer_writer() RETURNS void LANGUAGE sql SECURITY DEFINER SET default_transaction_read_only = off AS 'INSERT INTO ro_t VALUES (3)'",
		"CREATE ROLE app NOLOGIN",
		"GRANT app TO tsdbadmin",
		"GRANT ALL ON ro_t, ro_seq TO app",
		"SELECT lo_create(4242)",
		"GRANT SELECT, UPDATE ON LARGE OBJECT 4242 TO app",
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	const role, pw = "dbcloud_cred_ro0000001", "ro-credential-pw-1"
	syncCredentials(t, m, s, credential(role, pw, true, time.Now().Add(time.Hour)))
	if _, err := admin.Exec(ctx, "CREATE TABLE made_after(v text); INSERT INTO made_after VALUES ('later')"); err != nil {
		t.Fatal(err)
	}
	conn := mustConnect(t, credentialDSN(dsn, role, pw))
	var v string
	if err := conn.QueryRow(ctx, "SELECT v FROM made_after").Scan(&v); err != nil || v != "later" {
		t.Errorf("reading a table made after the credential: %q, %v", v, err)
	}
	tryReadOnlyEscapes(t, conn, admin)
	for _, escape := range []string{"SET SESSION AUTHORIZATION tsdbadmin", "SET ROLE tsdbadmin"} {
		_, err := conn.Exec(ctx, escape)
		t.Logf("%-40s -> %s", escape, orOK(pgtest.SQLState(err)))
		if _, err := conn.Exec(ctx, "SELECT definer_writer()"); pgtest.SQLState(err) != "25006" {
			t.Errorf("after %q, tsdbadmin's SECURITY DEFINER writer: %v, want 25006", escape, err)
		}
		if _, err := conn.Exec(ctx, "INSERT INTO ro_t VALUES (9)"); pgtest.SQLState(err) != "25006" {
			t.Errorf("after %q, INSERT: %v, want 25006", escape, err)
		}
		_, _ = conn.Exec(ctx, "RESET ROLE")
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM ro_t").Scan(&n); err != nil || n != 1 {
		t.Errorf("ro_t has %d rows (%v), want 1", n, err)
	}
}

// TestCredentials_ReadWrite: a READ_WRITE credential writes with
// tsdbadmin's privileges; when it is dropped, what it made passes to
// tsdbadmin (also in another database) and its open session ends.
func TestCredentials_ReadWrite(t *testing.T) {
	ctx := context.Background()
	m, s, dsn := guardInstance(t)
	admin := mustConnect(t, dsn)
	for _, sql := range []string{"CREATE TABLE rw_t(i int)", "CREATE DATABASE other"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	const role, pw = "dbcloud_cred_rw0000001", "rw-credential-pw-1"
	syncCredentials(t, m, s, credential(role, pw, false, time.Now().Add(time.Hour)))
	conn := mustConnect(t, credentialDSN(dsn, role, pw))
	for _, sql := range []string{"INSERT INTO rw_t VALUES (1)", "CREATE TABLE rw_made(i int)", "INSERT INTO rw_made VALUES (1)"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("READ_WRITE credential: %s: %v", sql, err)
		}
	}
	// Nothing it does outlives it as a login: it may not make, change or
	// grant roles, as itself, as tsdbadmin (SET ROLE) or through a
	// SECURITY DEFINER function it hands to tsdbadmin.
	for _, sql := range []string{
		"CREATE ROLE backdoor1 LOGIN PASSWORD 'x'",
		"SET ROLE tsdbadmin; CREATE ROLE backdoor2 LOGIN PASSWORD 'x'",
		"SET ROLE tsdbadmin; ALTER ROLE tsdbadmin PASSWORD 'taken'",
		"SET ROLE tsdbadmin; GRANT tsdbadmin TO " + role,
		"CREATE FUNCTION mint() RETURNS void LANGUAGE sql SECURITY DEFINER AS 'CREATE ROLE backdoor3 LOGIN'; " +
			"ALTER FUNCTION mint() OWNER TO tsdbadmin; SELECT mint()",
	} {
		_, err := conn.Exec(ctx, sql)
		if got := pgtest.SQLState(err); got != "42501" {
			t.Errorf("READ_WRITE credential: %s: %q (%v), want 42501", sql, got, err)
		}
		_, _ = conn.Exec(ctx, "RESET ROLE")
	}
	var backdoors int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'backdoor%'").Scan(&backdoors); err != nil || backdoors != 0 {
		t.Errorf("%d roles made by the credential (%v), want none", backdoors, err)
	}
	other := mustConnect(t, strings.Replace(credentialDSN(dsn, role, pw), "/tsdb?", "/other?", 1))
	if _, err := other.Exec(ctx, "CREATE TABLE there(i int)"); err != nil {
		t.Fatal(err)
	}

	change := syncCredentials(t, m, s)
	if len(change.Stale) != 1 || change.Stale[0] != role {
		t.Errorf("stale roles: %v, want [%s]", change.Stale, role)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("the dropped credential's open session still answers")
	}
	var owner string
	if err := admin.QueryRow(ctx, "SELECT tableowner::text FROM pg_tables WHERE tablename = 'rw_made'").Scan(&owner); err != nil || owner != TenantRole {
		t.Errorf("rw_made's owner after the drop: %q, %v; want %s", owner, err, TenantRole)
	}
	owner = ""
	if err := mustConnect(t, strings.Replace(dsn, "/tsdb?", "/other?", 1)).QueryRow(ctx,
		"SELECT tableowner::text FROM pg_tables WHERE tablename = 'there'").Scan(&owner); err != nil || owner != TenantRole {
		t.Errorf("there's owner (database other) after the drop: %q, %v; want %s", owner, err, TenantRole)
	}
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)", role).Scan(&exists); err != nil || exists {
		t.Errorf("role %s exists after the drop: %v, %v", role, exists, err)
	}
	if again := syncCredentials(t, m, s); len(again.Stale) != 0 {
		t.Errorf("a second sync found stale roles: %v", again.Stale)
	}
}

// TestCredentials_Sync: the sync is idempotent (a second one writes
// nothing), corrects a role changed behind its back, and an access change
// ends the role's sessions.
func TestCredentials_Sync(t *testing.T) {
	ctx := context.Background()
	m, s, dsn := guardInstance(t)
	const role, pw = "dbcloud_cred_sync000001", "sync-credential-pw-1"
	c := credential(role, pw, true, time.Now().Add(time.Hour))
	syncCredentials(t, m, s, c)
	xmin := func() string {
		var x string
		if err := superQuery(t, m, s, "SELECT xmin::text FROM pg_authid WHERE rolname = $1", []any{role}, &x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	before := xmin()
	if change := syncCredentials(t, m, s, c); len(change.Stale)+len(change.Reshaped) != 0 || xmin() != before {
		t.Errorf("a second sync changed something: %+v, xmin %s -> %s", change, before, xmin())
	}
	// The superuser (a tenant cannot) changes it; the sync puts it back.
	if err := m.Exec(ctx, s, "postgres", "ALTER ROLE "+role+" CREATEDB CONNECTION LIMIT 1 VALID UNTIL 'infinity'; ALTER ROLE "+role+" RESET ALL; GRANT pg_monitor TO "+role+"; REVOKE tsdbadmin FROM "+role+"; GRANT "+role+" TO tsdbadmin"); err != nil {
		t.Fatal(err)
	}
	syncCredentials(t, m, s, c)
	var state string
	if err := superQuery(t, m, s, `SELECT format('%s %s %s %s %s %s', a.rolcreatedb, a.rolconnlimit, a.rolvaliduntil = $1,
		(SELECT setconfig FROM pg_db_role_setting WHERE setrole = a.oid AND setdatabase = 0),
		ARRAY(SELECT roleid::regrole::text FROM pg_auth_members WHERE member = a.oid),
		ARRAY(SELECT member::regrole::text FROM pg_auth_members WHERE roleid = a.oid)) FROM pg_authid a WHERE rolname = $2`,
		[]any{c.Expires.Truncate(time.Microsecond), role}, &state); err != nil {
		t.Fatal(err)
	}
	if state != "f -1 t {tsdb_admin.read_only_role=on} {tsdbadmin} {}" {
		t.Errorf("role after the sync: %s", state)
	}
	// READ_ONLY to READ_WRITE: the open (read-only) session ends.
	conn := mustConnect(t, credentialDSN(dsn, role, pw))
	c.ReadOnly = false
	if change := syncCredentials(t, m, s, c); len(change.Reshaped) != 1 {
		t.Errorf("access change: %+v", change)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a session opened read-only outlived the change of access")
	}
	if _, err := mustConnect(t, credentialDSN(dsn, role, pw)).Exec(ctx, "CREATE TABLE now_writable(i int)"); err != nil {
		t.Errorf("after the change to READ_WRITE: %v", err)
	}
}

// TestCredentials_TenantCannotTouch: tsdbadmin (CREATEROLE) can neither
// change, grant, take over, drop nor imitate a credential role; an
// expired credential cannot log in.
func TestCredentials_TenantCannotTouch(t *testing.T) {
	ctx := context.Background()
	m, s, dsn := guardInstance(t)
	admin := mustConnect(t, dsn)
	const role, pw = "dbcloud_cred_tt00000001", "tt-credential-pw-1"
	syncCredentials(t, m, s, credential(role, pw, true, time.Now().Add(time.Hour)))
	for _, sql := range []string{
		"ALTER ROLE " + role + " PASSWORD 'mine'",
		"ALTER ROLE " + role + " VALID UNTIL 'infinity'",
		"ALTER ROLE " + role + " RESET tsdb_admin.read_only_role",
		"ALTER ROLE " + role + " SET tsdb_admin.read_only_role = off",
		"ALTER ROLE " + role + " IN DATABASE tsdb SET tsdb_admin.read_only_role = off",
		"ALTER ROLE " + role + " RESET ALL",
		"ALTER ROLE " + role + " RENAME TO mine",
		"GRANT " + role + " TO tsdbadmin",
		"REVOKE tsdbadmin FROM " + role,
		"GRANT app_none TO " + role,
		"DROP ROLE " + role,
		"CREATE ROLE dbcloud_cred_fake LOGIN PASSWORD 'x'",
		"CREATE ROLE \"DBCLOUD_CRED_fake\" LOGIN PASSWORD 'x'",
		"SET ROLE " + role,
	} {
		_, err := admin.Exec(ctx, sql)
		if got := pgtest.SQLState(err); got != "42501" {
			t.Errorf("tsdbadmin: %s: %q (%v), want 42501", sql, got, err)
		}
	}
	if _, err := pgx.Connect(ctx, credentialDSN(dsn, role, "mine")); err == nil {
		t.Error("logged in with the tenant's password")
	}
	mustConnect(t, credentialDSN(dsn, role, pw))
	// Expired: VALID UNTIL refuses the login.
	syncCredentials(t, m, s, credential(role, pw, true, time.Now().Add(-time.Second)))
	if c, err := pgx.Connect(ctx, credentialDSN(dsn, role, pw)); err == nil {
		c.Close(ctx)
		t.Error("an expired credential logged in")
	} else {
		t.Logf("expired: %v", err)
	}
}

// superQuery scans the one row sql (with args) returns, as the superuser.
func superQuery(t *testing.T, m *Instances, s Spec, sql string, args []any, dest ...any) error {
	t.Helper()
	ctx := context.Background()
	conn, err := m.Connect(ctx, s, "postgres")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}
