package postgres

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"dbcloud/internal/pgbin"
	"dbcloud/internal/pgtest"
	"dbcloud/runtime/local/internal/localtest"
)

// guardInstance starts one instance as a TIMESERIESDB service's would be
// (TimescaleDB preloaded, both addons' extensions created in tsdb by the
// superuser, as servePrimary does), with a tsdbadmin password, plus the
// pooler's lookup role as PgBouncer's setup would create it, and a role
// that a superuser made a member of pg_read_server_files (and one of
// pg_read_all_data). It returns the
// spec and a DSN for tsdbadmin over TLS.
func guardInstance(t *testing.T) (*Instances, Spec, string) {
	t.Helper()
	ctx := context.Background()
	base := localtest.Base(t)
	m := mustInstances(t, base, 0)
	s := mustSpec(t, base, "guard")
	s.Settings["shared_preload_libraries"] = "timescaledb"
	s.Settings["timescaledb.telemetry_level"] = "off"
	mustCreate(t, m, &s)
	const password = "guard-test-password"
	if err := setPassword(ctx, m, s, password); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE EXTENSION IF NOT EXISTS timescaledb",
		"CREATE EXTENSION IF NOT EXISTS vector",
		"CREATE ROLE " + PoolerRole + " LOGIN",
		"CREATE ROLE filereader NOLOGIN",
		"GRANT pg_read_server_files TO filereader",
		"CREATE ROLE datareader NOLOGIN",
		"GRANT pg_read_all_data TO datareader",
	} {
		if err := m.Exec(ctx, s, "tsdb", sql); err != nil {
			if strings.Contains(sql, "EXTENSION") && os.Getenv("CI") == "" {
				t.Skipf("%s: %v (extensions not built on this host; CI fails instead)", sql, err)
			}
			t.Fatalf("%s: %v", sql, err)
		}
	}
	return m, s, tcpDSN(s, password, "require")
}

func mustConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestGuard_EscapeMatrix makes, as tsdbadmin over TLS, every attempt a
// tenant would make to leave its database (issue 13's reproduction first)
// and wants each refused with SQLSTATE 42501; then what a database owner
// needs, which must keep working.
func TestGuard_EscapeMatrix(t *testing.T) {
	ctx := context.Background()
	m, s, dsn := guardInstance(t)
	conn := mustConnect(t, dsn)
	if _, err := conn.Exec(ctx, "CREATE TABLE out(line text); CREATE ROLE victim NOLOGIN; CREATE ROLE victim2 NOLOGIN"); err != nil {
		t.Fatal(err)
	}

	escapes := []string{
		"GRANT pg_execute_server_program, pg_read_server_files TO tsdbadmin",
		"COPY out FROM PROGRAM 'id'",
		"COPY out TO PROGRAM 'cat > /tmp/dbcloud-guard-escape'",
		"GRANT pg_write_server_files TO tsdbadmin",
		"GRANT pg_execute_server_program TO victim",
		"GRANT filereader TO tsdbadmin",
		"CREATE ROLE esc1 IN ROLE pg_execute_server_program",
		"CREATE ROLE esc2 ROLE tsdbadmin IN ROLE pg_read_server_files",
		"CREATE ROLE esc3 ADMIN tsdbadmin IN ROLE filereader",
		"ALTER GROUP pg_execute_server_program ADD USER tsdbadmin",
		"ALTER GROUP filereader ADD USER tsdbadmin",
		"COPY out FROM '/etc/passwd'",
		"COPY out TO '/tmp/dbcloud-guard-escape'",
		"ALTER SYSTEM SET work_mem = '1MB'",
		"LOAD 'dbcloud_guard'",
		"ALTER ROLE postgres PASSWORD 'x'",
		"ALTER ROLE " + PoolerRole + " PASSWORD 'x'",
		"ALTER ROLE " + PoolerRole + " SET search_path = evil",
		"ALTER ROLE victim2 RENAME TO dbcloud_victim",
		"CREATE ROLE dbcloud_monitor LOGIN",
		"GRANT victim TO " + PoolerRole,
		"GRANT " + PoolerRole + " TO tsdbadmin",
		"SET ROLE " + PoolerRole,
		"SET ROLE postgres",
		"SET SESSION AUTHORIZATION postgres",
		"CREATE LANGUAGE plevil HANDLER plpgsql_call_handler",
		"CREATE FUNCTION c_fn() RETURNS void LANGUAGE c AS 'dbcloud_guard', '_PG_init'",
		"CREATE FUNCTION internal_fn(cstring) RETURNS int LANGUAGE internal AS 'int4in'",
		"ALTER ROLE tsdbadmin SUPERUSER",
		// Issue 30: the predefined data roles. With pg_write_all_data a row
		// in _timescaledb_config.bgw_job owned by postgres ran as postgres.
		"GRANT pg_write_all_data TO tsdbadmin",
		"GRANT pg_read_all_data TO tsdbadmin",
		"GRANT pg_read_all_data, pg_write_all_data TO victim",
		"GRANT datareader TO tsdbadmin",
		"CREATE ROLE esc4 IN ROLE pg_write_all_data",
		"CREATE ROLE esc5 ADMIN tsdbadmin IN ROLE datareader",
		"ALTER GROUP pg_read_all_data ADD USER tsdbadmin",
		"ALTER GROUP datareader ADD USER victim",
		// Libraries loaded at every login of a database or role.
		"ALTER DATABASE tsdb SET local_preload_libraries = 'x'",
		"ALTER DATABASE tsdb SET session_preload_libraries = 'x'",
		"ALTER ROLE tsdbadmin SET local_preload_libraries = 'x'",
		"ALTER ROLE victim IN DATABASE tsdb SET local_preload_libraries = 'x'",
		"ALTER ROLE ALL IN DATABASE tsdb SET local_preload_libraries = 'x'",
		"ALTER ROLE ALL SET session_preload_libraries = 'x'",
		"ALTER ROLE ALL IN DATABASE tsdb SET tsdb_admin.read_only_role = true",
		// Reserved names, after case folding, trimming and NFKC.
		`CREATE ROLE "postgres "`,
		`CREATE ROLE "Postgres"`,
		`CREATE ROLE "DBCLOUD_POOLER"`,
		`CREATE ROLE " dbcloud_replicator"`,
		`CREATE ROLE "PG_MONITOR2"`,
		`CREATE ROLE U&"postgres\200B"`,
		`CREATE ROLE U&"postgres\00A0"`,
		`CREATE ROLE U&"\FF50\FF4F\FF53\FF54\FF47\FF52\FF45\FF53"`,
		`CREATE USER U&"\0009postgres"`,
		`ALTER ROLE victim2 RENAME TO "Dbcloud_Victim"`,
		// The pooler's lookup database: one a tenant made first would hold
		// the lookup function of its choice.
		"CREATE DATABASE " + PoolerDatabase,
		// Last: without the guard they take the role away from the rows above.
		"ALTER ROLE " + PoolerRole + " RENAME TO pooler2",
		"DROP ROLE " + PoolerRole,
	}
	var failed []string
	for _, sql := range escapes {
		_, err := conn.Exec(ctx, sql)
		// Without the guard, a SET ROLE that got through would change
		// who makes the rows after it.
		_, _ = conn.Exec(ctx, "RESET ROLE; RESET SESSION AUTHORIZATION")
		if got := pgtest.SQLState(err); got != "42501" {
			failed = append(failed, sql)
			t.Errorf("%s: got SQLSTATE %q (%v), want 42501", sql, got, err)
		} else if !strings.Contains(err.Error(), "reserved") && !strings.Contains(err.Error(), "not allowed") &&
			!strings.Contains(err.Error(), "permission denied") && !strings.Contains(err.Error(), "must be superuser") {
			t.Errorf("%s: the message does not say what is reserved: %v", sql, err)
		}
	}
	if len(failed) > 0 {
		t.Logf("%d of %d escapes were not refused:\n  %s", len(failed), len(escapes), strings.Join(failed, "\n  "))
	}
	// Nothing of the above took effect.
	var members int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_auth_members a JOIN pg_roles r ON r.oid = a.roleid
		WHERE r.rolname IN ('pg_execute_server_program', 'pg_read_server_files', 'pg_write_server_files', 'filereader', $1)
		  AND a.member <> 'filereader'::regrole`, PoolerRole).Scan(&members); err != nil {
		t.Fatal(err)
	}
	if members != 0 {
		t.Errorf("%d memberships in the reserved roles were granted", members)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_auth_members a JOIN pg_roles r ON r.oid = a.roleid
		WHERE r.rolname IN ('pg_read_all_data', 'pg_write_all_data', 'datareader')
		  AND a.member <> 'datareader'::regrole`).Scan(&members); err != nil || members != 0 {
		t.Errorf("%d memberships in the data roles were granted (%v)", members, err)
	}
	// pg_read_all_data would read the password hashes.
	var n int
	err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_authid").Scan(&n)
	if got := pgtest.SQLState(err); got != "42501" {
		t.Errorf("tsdbadmin reading pg_authid: got %q (%d rows, %v), want 42501", got, n, err)
	}
	var lookalikes []string
	rows, err := conn.Query(ctx, `SELECT rolname FROM pg_roles WHERE rolname NOT IN ('postgres', $1, $2)
		AND (lower(normalize(rolname, NFKC)) LIKE ANY (ARRAY['%postgres%', '%dbcloud%', '%pg\_monitor2%']))`, PoolerRole, ReplicatorRole)
	if err != nil {
		t.Fatal(err)
	}
	if lookalikes, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(lookalikes) > 0 {
		t.Errorf("roles named like reserved ones were made: %q (%v)", lookalikes, err)
	}
	var settings int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_db_role_setting s, unnest(s.setconfig) c
		WHERE c ILIKE '%preload%' OR c ILIKE 'tsdb_admin%'`).Scan(&settings); err != nil || settings != 0 {
		t.Errorf("%d preload or read-only settings were attached (%v)", settings, err)
	}

	t.Run("PredefinedRoles", func(t *testing.T) { predefinedRoles(t, conn) })
	t.Run("NoReplicationSlots", func(t *testing.T) { noReplicationSlots(t, m, s, conn) })

	// A database owner's search_path is not the superuser's: a function
	// named like a catalog one, first in tsdb's search_path, is not what
	// dbcloud's superuser session calls (pgbouncer's installLookup runs
	// this very query in every database).
	t.Run("SearchPathTrojan", func(t *testing.T) {
		for _, sql := range []string{
			"CREATE SCHEMA trojan",
			`CREATE FUNCTION trojan.pg_get_userbyid(oid) RETURNS name LANGUAGE plpgsql AS $$
			BEGIN EXECUTE 'ALTER ROLE tsdbadmin SUPERUSER'; RETURN 'x'; END $$`,
			"GRANT USAGE ON SCHEMA trojan TO PUBLIC",
			"ALTER DATABASE tsdb SET search_path = trojan, pg_catalog",
		} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		super, err := m.Connect(ctx, s, "tsdb")
		if err != nil {
			t.Fatal(err)
		}
		var owner *string
		err = super.QueryRow(ctx, "SELECT pg_get_userbyid(nspowner)::text FROM pg_namespace WHERE nspname = 'trojan'").Scan(&owner)
		super.Close(ctx)
		if err != nil || owner == nil || *owner != "tsdbadmin" {
			t.Errorf("the superuser's query answered %v, %v; want tsdbadmin from pg_catalog's function", owner, err)
		}
		var rolsuper bool
		if err := conn.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = 'tsdbadmin'").Scan(&rolsuper); err != nil || rolsuper {
			t.Errorf("tsdbadmin is a superuser now (%v): the trojan ran as the superuser", err)
		}
		if _, err := conn.Exec(ctx, "ALTER DATABASE tsdb RESET search_path"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("TLSRefusesCBC", func(t *testing.T) {
		for _, c := range []struct {
			suite uint16
			ok    bool
		}{
			{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, false},
			{tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, false},
			{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, true},
		} {
			cfg, err := pgx.ParseConfig(dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.TLSConfig = &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{c.suite}}
			cfg.Fallbacks = nil
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err == nil {
				conn.Close(ctx)
			}
			if (err == nil) != c.ok {
				t.Errorf("TLS 1.2 with only %s: error %v, want success %v", tls.CipherSuiteName(c.suite), err, c.ok)
			}
		}
	})

	t.Run("OwnerKeepsWhatItNeeds", func(t *testing.T) {
		for _, sql := range []string{
			"CREATE ROLE app LOGIN PASSWORD 'app-password-1'",
			"CREATE ROLE team NOLOGIN",
			"GRANT team TO app",
			"GRANT app TO tsdbadmin",
			"CREATE ROLE member2 LOGIN IN ROLE team",
			"ALTER ROLE app CONNECTION LIMIT 5",
			"ALTER ROLE app SET statement_timeout = '30s'",
			"ALTER ROLE app SET tsdb_admin.read_only_role = true",
			"ALTER ROLE app RESET tsdb_admin.read_only_role",
			"ALTER ROLE member2 RENAME TO member3",
			"DROP ROLE member3",
			"GRANT pg_signal_backend TO tsdbadmin",
			"GRANT pg_monitor TO app",
			"CREATE DATABASE appdb",
			"CREATE TABLE metrics(time timestamptz NOT NULL, device int, value float8)",
			"SELECT create_hypertable('metrics', 'time')",
			"INSERT INTO metrics SELECT now() - i * interval '1 hour', i % 4, i FROM generate_series(1, 100) i",
			"SELECT time_bucket('1 day', time), avg(value) FROM metrics GROUP BY 1",
			"CREATE TABLE items(id int, embedding vector(3))",
			"INSERT INTO items VALUES (1, '[1,2,3]'), (2, '[3,2,1]')",
			"CREATE INDEX ON items USING hnsw (embedding vector_l2_ops)",
			"CREATE INDEX ON items USING ivfflat (embedding vector_l2_ops) WITH (lists = 1)",
			"GRANT SELECT, INSERT ON metrics, out TO app",
			"CREATE FUNCTION add1(int) RETURNS int LANGUAGE sql AS 'SELECT $1 + 1'",
			"CREATE FUNCTION add2(i int) RETURNS int LANGUAGE plpgsql AS 'BEGIN RETURN i + 2; END'",
			"DO 'BEGIN PERFORM 1; END'",
			"SET ROLE app",
			"RESET ROLE",
			"ALTER ROLE tsdbadmin SET work_mem = '8MB'",
			"ALTER ROLE tsdbadmin RESET work_mem",
		} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
		// In a database of its own, tsdbadmin creates the trusted extension
		// itself: the guard lets the extension script's C functions through.
		appdb := mustConnect(t, strings.Replace(dsn, "/tsdb?", "/appdb?", 1))
		for _, sql := range []string{
			"CREATE EXTENSION timescaledb",
			"CREATE TABLE m(time timestamptz NOT NULL, v int)",
			"SELECT create_hypertable('m', 'time')",
		} {
			if _, err := appdb.Exec(ctx, sql); err != nil {
				t.Errorf("in appdb, %s: %v", sql, err)
			}
		}
		appdb.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE appdb"); err != nil {
			t.Errorf("DROP DATABASE appdb: %v", err)
		}
		if _, err := conn.CopyFrom(ctx, pgx.Identifier{"out"}, []string{"line"}, pgx.CopyFromRows([][]any{{"a"}, {"b"}})); err != nil {
			t.Errorf("COPY FROM STDIN: %v", err)
		}
		// pg_signal_backend on its own roles' sessions, never on the superuser's.
		appConn := mustConnect(t, strings.Replace(dsn, "tsdbadmin:guard-test-password", "app:app-password-1", 1))
		var pid, superPID int
		if err := appConn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
			t.Errorf("tsdbadmin terminating its role's session: %v %v", ok, err)
		}
		super, err := m.Connect(ctx, s, "tsdb")
		if err != nil {
			t.Fatal(err)
		}
		defer super.Close(ctx)
		if err := super.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&superPID); err != nil {
			t.Fatal(err)
		}
		err = conn.QueryRow(ctx, "SELECT pg_terminate_backend($1)", superPID).Scan(&ok)
		if got := pgtest.SQLState(err); got != "42501" {
			t.Errorf("tsdbadmin terminating the superuser's session: got %q (%v), want 42501", got, err)
		}
	})
}

// predefinedRoles grants each of PostgreSQL 15's predefined roles to a
// role of the tenant's, as tsdbadmin, and wants exactly the ones judged
// harmless in docs/security.md granted (then revoked again).
func predefinedRoles(t *testing.T, conn *pgx.Conn) {
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "CREATE ROLE holder NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		role    string
		granted bool
	}{
		{"pg_monitor", true},
		{"pg_read_all_settings", true},
		{"pg_read_all_stats", true},
		{"pg_stat_scan_tables", true},
		{"pg_signal_backend", true},
		{"pg_checkpoint", false},
		{"pg_database_owner", false},
		{"pg_read_all_data", false},
		{"pg_write_all_data", false},
		{"pg_read_server_files", false},
		{"pg_write_server_files", false},
		{"pg_execute_server_program", false},
	} {
		_, err := conn.Exec(ctx, "GRANT "+c.role+" TO holder")
		if c.granted {
			if err != nil {
				t.Errorf("GRANT %s: %v, want granted", c.role, err)
			} else if _, err := conn.Exec(ctx, "REVOKE "+c.role+" FROM holder"); err != nil {
				t.Errorf("REVOKE %s: %v", c.role, err)
			}
			continue
		}
		// pg_database_owner has no explicit members: PostgreSQL itself refuses.
		if got := pgtest.SQLState(err); got != "42501" && !(c.role == "pg_database_owner" && err != nil) {
			t.Errorf("GRANT %s: got SQLSTATE %q (%v), want 42501", c.role, got, err)
			_, _ = conn.Exec(ctx, "REVOKE "+c.role+" FROM holder")
		}
	}
}

// noReplicationSlots: tsdbadmin, without REPLICATION and unable to get it
// or to become a role that has it, can neither make a slot (which would
// hold WAL) nor drop dbcloud's.
func noReplicationSlots(t *testing.T, m *Instances, s Spec, conn *pgx.Conn) {
	ctx := context.Background()
	if err := m.Exec(ctx, s, "postgres", "SELECT pg_create_physical_replication_slot('dbcloud_guard_test')"); err != nil {
		t.Fatal(err)
	}
	defer m.Exec(ctx, s, "postgres", "SELECT pg_drop_replication_slot('dbcloud_guard_test')")
	for _, sql := range []string{
		"SELECT pg_create_physical_replication_slot('tenant_slot', true)",
		"SELECT pg_create_logical_replication_slot('tenant_slot', 'pgoutput')",
		"SELECT pg_drop_replication_slot('dbcloud_guard_test')",
		"CREATE ROLE replicant LOGIN REPLICATION",
		"ALTER ROLE tsdbadmin REPLICATION",
		"SET ROLE " + ReplicatorRole,
		"GRANT " + ReplicatorRole + " TO tsdbadmin",
	} {
		_, err := conn.Exec(ctx, sql)
		_, _ = conn.Exec(ctx, "RESET ROLE")
		if got := pgtest.SQLState(err); got != "42501" {
			t.Errorf("%s: got SQLSTATE %q (%v), want 42501", sql, got, err)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'dbcloud_guard_test'").Scan(&n); err != nil || n != 1 {
		t.Errorf("dbcloud's slot: %d (%v), want it kept", n, err)
	}
}

// TestGuard_SuperuserIgnoresTenantSettings: the owner of tsdb attaches to
// it every setting PostgreSQL lets it attach that would change how a
// session behaves (read-only, a 1 ms statement timeout, another role, a
// tablespace nobody can write, other date and string syntax ...); dbcloud's
// superuser sessions must still work as dbcloud expects. Settings attached
// before the guard refused them (local_preload_libraries, on every role
// tsdb_admin.read_only_role) are set here by the superuser, as an instance
// made before this change may have them.
func TestGuard_SuperuserIgnoresTenantSettings(t *testing.T) {
	ctx := context.Background()
	m, s, dsn := guardInstance(t)
	conn := mustConnect(t, dsn)
	for _, sql := range []string{
		"ALTER DATABASE tsdb SET default_transaction_read_only = on",
		"ALTER DATABASE tsdb SET statement_timeout = '1ms'",
		"ALTER DATABASE tsdb SET lock_timeout = '1ms'",
		"ALTER DATABASE tsdb SET idle_session_timeout = '1ms'",
		"ALTER DATABASE tsdb SET idle_in_transaction_session_timeout = '1ms'",
		"ALTER DATABASE tsdb SET role = 'tsdbadmin'",
		"ALTER DATABASE tsdb SET default_tablespace = 'pg_global'",
		"ALTER DATABASE tsdb SET default_transaction_isolation = 'serializable'",
		"ALTER DATABASE tsdb SET default_transaction_deferrable = on",
		"ALTER DATABASE tsdb SET standard_conforming_strings = off",
		"ALTER DATABASE tsdb SET DateStyle = 'SQL, DMY'",
		"ALTER DATABASE tsdb SET IntervalStyle = 'sql_standard'",
		"ALTER DATABASE tsdb SET TimeZone = 'Pacific/Kiritimati'",
		"ALTER DATABASE tsdb SET bytea_output = 'escape'",
		"ALTER DATABASE tsdb SET check_function_bodies = off",
		"ALTER DATABASE tsdb SET client_min_messages = 'error'",
		"ALTER DATABASE tsdb SET synchronous_commit = off",
		"ALTER ROLE ALL IN DATABASE tsdb SET search_path = public",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Run("TenantSettings", func(t *testing.T) { superuserUnaffected(t, m, s) })
	t.Run("SettingsFromBeforeTheGuard", func(t *testing.T) {
		for _, sql := range []string{
			"ALTER DATABASE tsdb SET local_preload_libraries = 'dbcloud_guard_missing'",
			"ALTER ROLE ALL IN DATABASE tsdb SET tsdb_admin.read_only_role = on",
		} {
			if err := m.Exec(ctx, s, "postgres", sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		// In force for everyone else: a new tsdbadmin session is refused
		// (the missing library).
		if c, err := pgx.Connect(ctx, dsn); err == nil {
			c.Close(ctx)
			t.Error("a new tsdbadmin session started: the attached settings are not in force")
		}
		superuserUnaffected(t, m, s)
	})
	if err := m.Exec(ctx, s, "postgres", "ALTER DATABASE tsdb RESET ALL; ALTER ROLE ALL IN DATABASE tsdb RESET ALL"); err != nil {
		t.Errorf("the superuser resetting the settings: %v", err)
	}
}

// superuserUnaffected opens dbcloud's superuser session on tsdb and wants
// it to behave as dbcloud expects, whatever is attached to tsdb.
func superuserUnaffected(t *testing.T, m *Instances, s Spec) {
	t.Helper()
	ctx := context.Background()
	super, err := m.Connect(ctx, s, "tsdb")
	if err != nil {
		t.Fatalf("dbcloud's superuser connection to tsdb: %v", err)
	}
	defer super.Close(ctx)
	for _, c := range []struct{ sql, want string }{
		{"SELECT current_user::text", "postgres"},
		{"SHOW default_transaction_read_only", "off"},
		{"SHOW transaction_isolation", "read committed"},
		{"SHOW DateStyle", "ISO, MDY"},
		{"SELECT '1 day 02:00'::interval::text", "1 day 02:00:00"},
		{"SELECT '2024-01-02 03:04:05+00'::timestamptz::text", "2024-01-02 03:04:05+00"},
		{`SELECT 'a\b'`, `a\b`},
		{`SELECT '\x01'::bytea::text`, `\x01`},
		{"SHOW local_preload_libraries", ""},
		{"SHOW tsdb_admin.read_only_role", "off"},
		{"SHOW synchronous_commit", "on"},
		{"SHOW search_path", SuperuserSearchPath},
		// Outlives a 1 ms statement, lock and idle timeout.
		{"SELECT pg_sleep(0.05)::text", ""},
		{"SELECT pg_sleep(0.05)::text", ""},
	} {
		var got string
		if err := super.QueryRow(ctx, c.sql).Scan(&got); err != nil || got != c.want {
			t.Errorf("%s: %q (%v), want %q", c.sql, got, err, c.want)
		}
	}
	// It writes, in a table and a temporary table, in the default tablespace.
	for _, sql := range []string{
		"CREATE TABLE public.dbcloud_probe AS SELECT 1 AS i",
		"CREATE TEMP TABLE dbcloud_probe_tmp(i int)",
		"BEGIN; LOCK TABLE public.dbcloud_probe; COMMIT",
		"DROP TABLE public.dbcloud_probe",
	} {
		if _, err := super.Exec(ctx, sql); err != nil {
			t.Errorf("superuser %s: %v", sql, err)
		}
	}
}

// roEscapes are the ways out of a read-only session a client would try.
// Each is followed by a write, which must fail with 25006 whatever the
// attempt itself answered.
var roEscapes = []string{
	"",
	"SET tsdb_admin.read_only_connection = off",
	"RESET tsdb_admin.read_only_connection",
	"SET tsdb_admin.read_only_role = off",
	"RESET tsdb_admin.read_only_role",
	"SET default_transaction_read_only = off",
	"RESET default_transaction_read_only",
	"SET transaction_read_only = off",
	"SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
	"RESET ALL",
	"DISCARD ALL",
	"SELECT set_config('default_transaction_read_only', 'off', false)",
	"SELECT set_config('transaction_read_only', 'off', false)",
	"SELECT set_config('tsdb_admin.read_only_connection', 'off', false)",
	"SELECT set_config('tsdb_admin.read_only_role', 'off', false)",
	"SET ROLE tsdbadmin",
	"SET ROLE app",
	"RESET ROLE",
	"SELECT set_config('transaction_read_only', 'off', true)",
	"BEGIN; SELECT set_config('transaction_read_only', 'off', true); INSERT INTO ro_t VALUES (1); COMMIT",
	"ALTER ROLE CURRENT_USER RESET ALL",
	"ALTER ROLE CURRENT_USER SET tsdb_admin.read_only_role = false",
}

// roWrites are the writes tried after each escape; each must fail with
// 25006 ("BEGIN READ WRITE; INSERT" is sent as one simple-protocol string).
var roWrites = []string{
	"INSERT INTO ro_t VALUES (1)",
	"BEGIN READ WRITE; INSERT INTO ro_t VALUES (1); COMMIT",
	"BEGIN; SET TRANSACTION READ WRITE; INSERT INTO ro_t VALUES (1); COMMIT",
	"START TRANSACTION READ WRITE; INSERT INTO ro_t VALUES (1); COMMIT",
	"SELECT ro_writer()",
	"DO 'BEGIN INSERT INTO ro_t VALUES (1); END'",
	"CREATE TABLE ro_new(i int)",
	"SELECT nextval('ro_seq')",
	"UPDATE ro_t SET i = i + 1",
	// PostgreSQL 15's large-object functions do not check read-only.
	"SELECT lo_creat(-1)",
	"SELECT lo_from_bytea(0, 'x')",
	"SELECT lo_put(4242, 0, 'x')",
	"CREATE TEMP TABLE ro_tmp AS SELECT 1",
}

// readOnlyOption is the startup option tiger-cli sends
// (internal/common/connection.go), byte for byte.
const readOnlyOption = "options=-c%20tsdb_admin.read_only_connection%3Dtrue"

// fastPathWrite creates a large object through the protocol's fast-path
// function call (what libpq's lo_creat sends): it reaches the function
// without the executor or a utility statement, in a transaction of its own.
func fastPathWrite(t *testing.T, conn *pgx.Conn) error {
	t.Helper()
	ctx := context.Background()
	var fn uint32
	if err := conn.QueryRow(ctx, "SELECT 'pg_catalog.lo_creat(integer)'::regprocedure::oid", pgx.QueryExecModeSimpleProtocol).Scan(&fn); err != nil {
		t.Fatal(err)
	}
	fe := conn.PgConn().Frontend()
	fe.Send(&pgproto3.FunctionCall{Function: fn, ArgFormatCodes: []uint16{0}, Arguments: [][]byte{[]byte("393216")}, ResultFormatCode: 0})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var callErr error
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			callErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			return callErr
		}
	}
}

// tryReadOnlyEscapes runs every escape then every write on conn, and wants
// each write refused with 25006 and the table unchanged.
func tryReadOnlyEscapes(t *testing.T, conn *pgx.Conn, admin *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	for _, escape := range roEscapes {
		if escape != "" {
			_, err := conn.Exec(ctx, escape)
			t.Logf("%-70s -> %s", escape, orOK(pgtest.SQLState(err)))
			_, _ = conn.Exec(ctx, "ROLLBACK") // an escape that failed inside BEGIN leaves the block open
		}
		for _, w := range roWrites {
			_, err := conn.Exec(ctx, w)
			if got := pgtest.SQLState(err); got != "25006" {
				t.Errorf("after %q, %s: got SQLSTATE %q (%v), want 25006", escape, w, got, err)
			}
			_, _ = conn.Exec(ctx, "ROLLBACK")
		}
		if _, err := conn.CopyFrom(ctx, pgx.Identifier{"ro_t"}, []string{"i"}, pgx.CopyFromRows([][]any{{1}})); pgtest.SQLState(err) != "25006" {
			t.Errorf("after %q, COPY FROM STDIN: got %v, want 25006", escape, err)
		}
		if err := fastPathWrite(t, conn); pgtest.SQLState(err) != "25006" {
			t.Errorf("after %q, lo_creat by fast-path call: got %v, want 25006", escape, err)
		}
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM ro_t").Scan(&n); err != nil || n != 1 {
		t.Errorf("ro_t has %d rows (%v), want the 1 row it started with", n, err)
	}
	var lo []byte
	if err := admin.QueryRow(ctx, "SELECT count(*), lo_get(4242) FROM pg_largeobject_metadata GROUP BY 2").Scan(&n, &lo); err != nil || n != 1 || len(lo) != 0 {
		t.Errorf("%d large objects, 4242 holds %q (%v); want only 4242, empty", n, lo, err)
	}
}

func orOK(s string) string {
	if s == "" {
		return "accepted"
	}
	return s
}

// TestGuard_ReadOnly opens a session with the startup option tiger-cli
// sends (tsdb_admin.read_only_connection) and one as a role with
// tsdb_admin.read_only_role, tries every way out in each, and wants every
// write refused with 25006.
func TestGuard_ReadOnly(t *testing.T) {
	ctx := context.Background()
	_, _, dsn := guardInstance(t)
	admin := mustConnect(t, dsn)
	for _, sql := range []string{
		"CREATE TABLE ro_t(i int)",
		"INSERT INTO ro_t VALUES (0)",
		"CREATE SEQUENCE ro_seq",
		"CREATE FUNCTION ro_writer() RETURNS void LANGUAGE sql SET default_transaction_read_only = off AS 'INSERT INTO ro_t VALUES (2)'",
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

	t.Run("Connection", func(t *testing.T) {
		conn := mustConnect(t, dsn+"&"+readOnlyOption)
		var on string
		if err := conn.QueryRow(ctx, "SHOW tsdb_admin.read_only_connection").Scan(&on); err != nil || on != "on" {
			t.Errorf("SHOW tsdb_admin.read_only_connection: %q %v, want on (the guard's boolean, not a placeholder)", on, err)
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM ro_t").Scan(&n); err != nil {
			t.Errorf("a read-only session must still read: %v", err)
		}
		// Parallel workers restore the session's settings, the guard's too.
		if _, err := conn.Exec(ctx, "SET force_parallel_mode = on"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM ro_t").Scan(&n); err != nil {
			t.Errorf("a read-only session must still read in parallel: %v", err)
		}
		if _, err := conn.Exec(ctx, "RESET force_parallel_mode"); err != nil {
			t.Fatal(err)
		}
		tryReadOnlyEscapes(t, conn, admin)
	})

	roDSN := strings.Replace(dsn, "tsdbadmin:guard-test-password", "ro_user:ro-password-1", 1)
	t.Run("Role", func(t *testing.T) {
		for _, sql := range []string{
			// tiger db create role --read-only, in its transaction:
			"BEGIN; CREATE ROLE ro_user WITH LOGIN PASSWORD 'ro-password-1' IN ROLE tsdbadmin; ALTER ROLE ro_user SET tsdb_admin.read_only_role = true; COMMIT",
			"GRANT app TO ro_user",
			"GRANT ALL ON ro_t, ro_seq TO ro_user",
			"GRANT SELECT, UPDATE ON LARGE OBJECT 4242 TO ro_user",
		} {
			if _, err := admin.Exec(ctx, sql); err != nil {
				_, _ = admin.Exec(ctx, "ROLLBACK")
				t.Fatalf("%s: %v", sql, err)
			}
		}
		conn := mustConnect(t, roDSN)
		var n int
		if _, err := conn.Exec(ctx, "SET force_parallel_mode = on"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM ro_t").Scan(&n); err != nil {
			t.Errorf("a read-only role must still read in parallel: %v", err)
		}
		if _, err := conn.Exec(ctx, "RESET force_parallel_mode"); err != nil {
			t.Fatal(err)
		}
		tryReadOnlyEscapes(t, conn, admin)
		// A startup option outranks the role's setting, so it is refused.
		_, err := pgx.Connect(ctx, roDSN+"&options=-c%20tsdb_admin.read_only_role%3Doff")
		if err == nil {
			t.Error("a read-only role connected with -c tsdb_admin.read_only_role=off")
		}
	})

	t.Run("AdminUnsets", func(t *testing.T) {
		if _, err := admin.Exec(ctx, "ALTER ROLE ro_user RESET tsdb_admin.read_only_role"); err != nil {
			t.Fatal(err)
		}
		conn := mustConnect(t, roDSN)
		if _, err := conn.Exec(ctx, "INSERT INTO ro_t VALUES (5)"); err != nil {
			t.Errorf("after tsdbadmin reset read_only_role, the role must write: %v", err)
		}
		// The role itself may not set (or unset) it.
		_, err := conn.Exec(ctx, "ALTER ROLE ro_user SET tsdb_admin.read_only_role = true")
		if got := pgtest.SQLState(err); got != "42501" {
			t.Errorf("the role setting its own read_only_role: got %q (%v), want 42501", got, err)
		}
		_, err = admin.Exec(ctx, "ALTER DATABASE tsdb SET tsdb_admin.read_only_role = true")
		if got := pgtest.SQLState(err); got != "42501" {
			t.Errorf("read_only_role on a database: got %q (%v), want 42501", got, err)
		}
		_, err = admin.Exec(ctx, "SET tsdb_admin.read_only_role = true")
		if got := pgtest.SQLState(err); got != "42501" {
			t.Errorf("SET tsdb_admin.read_only_role in a session: got %q (%v), want 42501", got, err)
		}
	})
}

// walLSN is the instance's current WAL position, in bytes.
func walLSN(t *testing.T, m *Instances, s Spec) int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := m.Connect(ctx, s, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCheckGuard: without the library dbcloud refuses to start, saying
// what to run; with it (as scripts/deps.sh installs it here) it starts.
func TestCheckGuard(t *testing.T) {
	err := checkGuard(filepath.Join(t.TempDir(), "bin"))
	if err == nil || !strings.Contains(err.Error(), "dbcloud_guard") || !strings.Contains(err.Error(), "scripts/deps.sh") {
		t.Errorf("no library: got %v, want an error naming dbcloud_guard and scripts/deps.sh", err)
	}
	if err := checkGuard(pgbin.Dir()); err != nil {
		t.Errorf("the host's PostgreSQL: %v (scripts/deps.sh installs the guard)", err)
	}
}

// TestGuard_StorageReadOnly: with dbcloud_guard.storage_read_only on (a
// service at 95% of its storage limit, set by a reload), a tenant's writes
// that add data fail with 25006 and nothing in a session turns it off,
// while reads and what frees space (DELETE, TRUNCATE, DROP, VACUUM) run and
// dbcloud's superuser still writes; turned off by another reload, writes
// succeed again.
func TestGuard_StorageReadOnly(t *testing.T) {
	ctx := context.Background()
	m, s, dsn := guardInstance(t)
	conn := mustConnect(t, dsn)
	defer conn.Close(ctx)
	for _, sql := range []string{
		"CREATE TABLE kept AS SELECT g AS x FROM generate_series(1, 1000) g",
		"CREATE TABLE gone AS SELECT g AS x FROM generate_series(1, 1000) g",
		"CREATE TABLE emptied AS SELECT g AS x FROM generate_series(1, 1000) g",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	setStorageReadOnly := func(on string) {
		t.Helper()
		s.Settings["dbcloud_guard.storage_read_only"] = on
		if _, err := m.Reload(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// A reload reaches a session at its next statement; poll until it did.
	waitInsert := func(wantState string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := conn.Exec(ctx, "INSERT INTO kept VALUES (0)")
			if pgtest.SQLState(err) == wantState {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("INSERT: %v, want SQLSTATE %q", err, wantState)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// Made before the limit is reached: what later tries to grow through them.
	for _, sql := range []string{
		"CREATE SEQUENCE seq",
		"SELECT lo_create(4243)",
		`CREATE FUNCTION emit(text) RETURNS pg_lsn LANGUAGE sql AS 'SELECT pg_logical_emit_message(false, ''x'', $1)'`,
		`CREATE FUNCTION emit_on_delete() RETURNS trigger LANGUAGE plpgsql AS
			'BEGIN PERFORM pg_logical_emit_message(false, ''x'', ''y''); RETURN OLD; END'`,
		"CREATE TABLE trapped AS SELECT 1 AS x",
		"CREATE TRIGGER emit BEFORE DELETE ON trapped FOR EACH ROW EXECUTE FUNCTION emit_on_delete()",
		"PREPARE emit_prepared AS SELECT pg_logical_emit_message(true, 'x', 'y')",
		"EXECUTE emit_prepared",
		`CREATE FUNCTION emit_plpgsql() RETURNS void LANGUAGE plpgsql AS
			'DECLARE l pg_lsn; BEGIN l := pg_logical_emit_message(false, ''x'', ''y''); END'`,
		"CREATE TABLE metrics(time timestamptz NOT NULL, v int)",
		"SELECT create_hypertable('metrics', 'time', chunk_time_interval => interval '1 day')",
		"INSERT INTO metrics SELECT now() - i * interval '1 day', i FROM generate_series(0, 29) i",
		"CREATE TABLE plain(time timestamptz NOT NULL)",
		"CREATE PROCEDURE noop(job_id int, config jsonb) LANGUAGE plpgsql AS 'BEGIN END'",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// An extension's function runs as its owner, a superuser, for anyone.
	if err := m.Exec(ctx, s, "tsdb", `CREATE FUNCTION public.definer_emit() RETURNS pg_lsn LANGUAGE sql SECURITY DEFINER
		AS 'SELECT pg_catalog.pg_logical_emit_message(false, ''x'', ''y'')'`); err != nil {
		t.Fatal(err)
	}
	// A PL/pgSQL expression keeps its evaluation state for the rest of the
	// transaction: this one was set up before the limit was reached.
	held := mustConnect(t, dsn)
	if _, err := held.Exec(ctx, "BEGIN; SELECT emit_plpgsql()"); err != nil {
		t.Fatal(err)
	}
	walBefore := walLSN(t, m, s)

	setStorageReadOnly("on")
	waitInsert("25006")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var on string
		if err := held.QueryRow(ctx, "SHOW dbcloud_guard.storage_read_only").Scan(&on); err != nil {
			t.Fatal(err)
		}
		if on == "on" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the open transaction's session never saw storage_read_only")
		}
	}
	if _, err := held.Exec(ctx, "SELECT emit_plpgsql()"); pgtest.SQLState(err) != "25006" {
		t.Errorf("in a transaction opened before the limit, a PL/pgSQL expression set up then: %v, want 25006", err)
	}
	_, _ = held.Exec(ctx, "ROLLBACK")
	for _, c := range []struct{ sql, state string }{
		{"UPDATE kept SET x = x + 1", "25006"},
		{"CREATE TABLE more (x int)", "25006"},
		{"CREATE TABLE more AS SELECT 1", "25006"},
		{"SELECT 1 AS x INTO more", "25006"},
		{"CREATE INDEX ON kept (x)", "25006"},
		{"ALTER TABLE kept ADD COLUMN y text DEFAULT 'grows'", "25006"},
		{"WITH w AS (INSERT INTO kept VALUES (1) RETURNING x) SELECT * FROM w", "25006"},
		{"DO $$ BEGIN INSERT INTO kept VALUES (1); END $$", "25006"},
		{"CREATE DATABASE more", "25006"},
		// Issue 30: WAL and large objects, whatever calls them.
		{"SELECT pg_logical_emit_message(true, 'x', repeat('m', 1024 * 1024)) FROM generate_series(1, 3)", "25006"},
		{"SELECT pg_logical_emit_message(false, 'x', repeat('m', 1024 * 1024)::bytea)", "25006"},
		{"SELECT * FROM pg_logical_emit_message(false, 'x', 'y')", "25006"},
		{"SELECT emit(repeat('m', 1024 * 1024))", "25006"},
		{"EXECUTE emit_prepared", "25006"},
		{"DO $$ BEGIN EXECUTE 'SELECT pg_logical_emit_message(false, ''x'', ''y'')'; END $$", "25006"},
		{"DO $$ DECLARE l pg_lsn; BEGIN l := pg_logical_emit_message(false, 'x', 'y'); END $$", "25006"},
		{"DELETE FROM trapped", "25006"},
		{"SELECT definer_emit()", "25006"},
		// TimescaleDB's C functions that add rows or data.
		{"SELECT add_job('noop', '1h')", "25006"},
		{"SELECT add_retention_policy('metrics', interval '1 year')", "25006"},
		{"SELECT create_hypertable('plain', 'time')", "25006"},
		{"SELECT lo_from_bytea(0, 'x')", "25006"},
		{"SELECT lo_creat(-1)", "25006"},
		{"SELECT lo_create(0)", "25006"},
		{"SELECT lo_put(4243, 0, 'x')", "25006"},
		{"SELECT lowrite(lo_open(4243, 131072), 'x')", "25006"},
		{"SELECT lo_truncate(lo_open(4243, 131072), 10)", "25006"},
		{"SELECT nextval('seq')", "25006"},
		{"SELECT setval('seq', 42)", "25006"},
		{"NOTIFY chan, 'x'", "25006"},
		{"SELECT pg_notify('chan', 'x')", "25006"},
		{"SELECT * FROM kept FOR UPDATE", "25006"},
		{"EXPLAIN ANALYZE CREATE TABLE more AS SELECT 1", "25006"},
		{"DO $$ BEGIN EXECUTE 'CREATE TABLE more AS SELECT 1'; END $$", "25006"},
		{"CREATE TEMP TABLE tmp(x int)", "25006"},
		{"COMMENT ON TABLE kept IS 'grows pg_description'", "25006"},
		{"GRANT SELECT ON kept TO PUBLIC", "25006"},
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'", "25006"},
		{"CREATE VIEW v AS SELECT 1", "25006"},
		{"CREATE SCHEMA grows", "25006"},
		{"CREATE TYPE grows AS (a int)", "25006"},
		{"CREATE SEQUENCE grows_seq", "25006"},
		{"CREATE ROLE grows", "25006"},
		{"ALTER ROLE tsdbadmin SET work_mem = '1MB'", "25006"},
		{"BEGIN; PREPARE TRANSACTION 'grows'", "25006"},
		{"ROLLBACK", ""},
		// No way out from inside a session.
		{"SET dbcloud_guard.storage_read_only = off", "55P02"},
		{"ALTER SYSTEM SET dbcloud_guard.storage_read_only = off", "42501"},
		{"SELECT set_config('dbcloud_guard.storage_read_only', 'off', false)", "55P02"},
		// Reads, and what frees space.
		{"SELECT count(*) FROM kept", ""},
		{"DELETE FROM kept WHERE x > 900", ""},
		{"TRUNCATE emptied", ""},
		{"DROP TABLE gone", ""},
		{"VACUUM kept", ""},
		{"ANALYZE kept", ""},
		{"SELECT time_bucket('1 week', time), sum(v) FROM metrics GROUP BY 1", ""},
		{"SELECT count(*) FROM drop_chunks('metrics', older_than => now() - interval '10 days')", ""},
		{"SELECT length(lo_get(4243))", ""},
		{"SELECT lo_unlink(4243)", ""},
		{"SET work_mem = '8MB'", ""},
		{"LISTEN chan", ""},
		{"EXPLAIN SELECT * FROM kept", ""},
		{"BEGIN; DECLARE c CURSOR FOR SELECT * FROM kept; FETCH 1 FROM c; COMMIT", ""},
		{"BEGIN; LOCK TABLE kept IN ACCESS SHARE MODE; COMMIT", ""},
	} {
		_, err := conn.Exec(ctx, c.sql)
		if got := pgtest.SQLState(err); got != c.state {
			t.Errorf("%s: %v (SQLSTATE %q), want %q", c.sql, err, got, orOK(c.state))
		}
	}
	if _, err := conn.Exec(ctx, "COPY kept FROM STDIN"); pgtest.SQLState(err) != "25006" {
		t.Errorf("COPY FROM STDIN: %v, want 25006", err)
	}
	if err := fastPathWrite(t, conn); pgtest.SQLState(err) != "25006" {
		t.Errorf("lo_creat by fast-path call: %v, want 25006", err)
	}
	// What the refused calls would have written: 3 MiB of messages, twice.
	if grown := walLSN(t, m, s) - walBefore; grown > 1<<20 {
		t.Errorf("WAL grew by %d bytes while storage was read-only", grown)
	} else {
		t.Logf("WAL grew by %d bytes while storage was read-only", grown)
	}
	if err := m.Exec(ctx, s, "tsdb", "INSERT INTO public.kept VALUES (-1)"); err != nil {
		t.Errorf("the superuser's write while storage is read-only: %v", err)
	}
	if err := m.Exec(ctx, s, "tsdb", "SELECT pg_catalog.pg_logical_emit_message(false, 'dbcloud', 'x'), pg_catalog.nextval('public.seq')"); err != nil {
		t.Errorf("the superuser's WAL and sequence while storage is read-only: %v", err)
	}

	setStorageReadOnly("off")
	waitInsert("")
	if _, err := conn.Exec(ctx, "CREATE TABLE more AS SELECT 1 AS x"); err != nil {
		t.Errorf("CREATE TABLE after the limit was lifted: %v", err)
	}
}

// TestGuard_Seal: while SealFile is in the data directory, a tenant's
// login (over TLS, and over the unix socket) is refused with 57P03 and a
// message saying the service is switching, while dbcloud's superuser over
// the socket still gets in; without the file logins are as before. On
// every installed version the guard is built for.
func TestGuard_Seal(t *testing.T) {
	ctx := context.Background()
	for major, binDir := range pgbin.Installed("/usr/lib/postgresql") {
		if _, err := os.Stat(filepath.Join(filepath.Dir(binDir), "lib", GuardLibrary+".so")); err != nil {
			continue
		}
		t.Run(strconv.Itoa(major), func(t *testing.T) {
			base := localtest.Base(t)
			m, err := NewInstances(Config{BinDir: binDir, PoolDir: filepath.Join(base, "pool"), Logger: localtest.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			s := mustSpec(t, base, "seal")
			mustCreate(t, m, &s)
			const password = "seal-test-password"
			if err := setPassword(ctx, m, s, password); err != nil {
				t.Fatal(err)
			}
			tenant := map[string]string{
				"tls":    tcpDSN(s, password, "require"),
				"socket": fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable connect_timeout=5", s.RunDir(), s.Port, password),
			}
			login := func(dsn string) error {
				conn, err := pgx.Connect(ctx, dsn)
				if err == nil {
					conn.Close(ctx)
				}
				return err
			}
			seal := filepath.Join(s.PGData(), SealFile)
			if err := os.WriteFile(seal, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			for how, dsn := range tenant {
				err := login(dsn)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "57P03" || !strings.Contains(pgErr.Message, "switching to a new PostgreSQL version") {
					t.Errorf("a tenant's login over %s while sealed: %v, want 57P03 saying the service is switching", how, err)
				}
			}
			if conn, err := m.Connect(ctx, s, "postgres"); err != nil {
				t.Errorf("dbcloud's login while sealed: %v, want let in", err)
			} else {
				conn.Close(ctx)
			}
			if err := os.Remove(seal); err != nil {
				t.Fatal(err)
			}
			for how, dsn := range tenant {
				if err := login(dsn); err != nil {
					t.Errorf("a tenant's login over %s once unsealed: %v", how, err)
				}
			}
		})
	}
}
