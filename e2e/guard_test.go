package e2e

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"dbcloud/internal/pgtest"

	"github.com/jackc/pgx/v5"
)

// tigerReadOnly is the startup option tiger-cli adds for a read-only
// connection (internal/common/connection.go), byte for byte.
const tigerReadOnly = "&options=-c%20tsdb_admin.read_only_connection%3Dtrue"

// tenantEscapes are statements by which tsdbadmin would reach beyond its
// database (the host's or pod's programs and files, the server's
// configuration, reserved roles, C code), each refused with 42501 on every
// runtime: they need the table out(line text).
var tenantEscapes = []string{
	"GRANT pg_execute_server_program, pg_read_server_files TO tsdbadmin",
	"COPY out FROM PROGRAM 'id'",
	"COPY out FROM PROGRAM 'cat /proc/*/cmdline'",
	"CREATE ROLE esc IN ROLE pg_execute_server_program",
	"ALTER GROUP pg_read_server_files ADD USER tsdbadmin",
	"COPY out FROM '/etc/passwd'",
	"COPY out TO '/tmp/dbcloud-e2e-guard'",
	"ALTER SYSTEM SET work_mem = '1MB'",
	"LOAD 'dbcloud_guard'",
	"ALTER ROLE postgres PASSWORD 'x'",
	"CREATE ROLE dbcloud_evil",
	"SET ROLE postgres",
	"CREATE FUNCTION c_fn() RETURNS void LANGUAGE c AS 'dbcloud_guard', '_PG_init'",
}

// TestGuard_Tenant drives the real binary: a service made through the API,
// its tsdbadmin over TLS making issue 13's reproduction and the other ways
// out of its database (each must answer 42501, while a second service of
// the same host keeps its data); read-only sessions as tiger-cli opens
// them, directly, through a read replica set's endpoint and through the
// pooler (every write 25006); and CBC suites refused by the API,
// PostgreSQL and PgBouncer (openssl s_client).
func TestGuard_Tenant(t *testing.T) {
	t.Parallel()
	var dir string
	t.Cleanup(func() {
		if dir != "" {
			stopPoolers(dir)
		}
	})
	s := newServer(t)
	dir = s.dir
	ctx := context.Background()
	createdA := s.create(map[string]any{"name": "tenant-a", "cpu_millis": "shared", "environment_tag": "PROD"})
	createdB := s.create(map[string]any{"name": "tenant-b", "cpu_millis": "shared"})
	a := s.waitStatus(createdA.ServiceID, "READY", 90*time.Second)
	b := s.waitStatus(createdB.ServiceID, "READY", 90*time.Second)
	pw := createdA.InitialPassword
	cb := s.mustConnect(b, createdB.InitialPassword)
	if _, err := cb.Exec(ctx, "CREATE TABLE secret(v text); INSERT INTO secret VALUES ('b')"); err != nil {
		t.Fatal(err)
	}
	ca := s.mustConnect(a, pw)
	if _, err := ca.Exec(ctx, "CREATE TABLE out(line text); CREATE TABLE t(i int); INSERT INTO t VALUES (0)"); err != nil {
		t.Fatal(err)
	}

	t.Run("Escapes", func(t *testing.T) {
		for _, sql := range tenantEscapes {
			if _, err := ca.Exec(ctx, sql); pgtest.SQLState(err) != "42501" {
				t.Errorf("%s: got %v, want SQLSTATE 42501", sql, err)
			}
		}
		var lines int
		if err := ca.QueryRow(ctx, "SELECT count(*) FROM out").Scan(&lines); err != nil || lines != 0 {
			t.Errorf("out has %d lines (%v): a program or file was read", lines, err)
		}
		var v string
		if err := cb.QueryRow(ctx, "SELECT v FROM secret").Scan(&v); err != nil || v != "b" {
			t.Errorf("service B's data: %q %v", v, err)
		}
	})

	// tiger db create role --name ro_user --read-only, as it runs it.
	for _, sql := range []string{
		"BEGIN; CREATE ROLE ro_user WITH LOGIN PASSWORD 'ro-password-1'; ALTER ROLE ro_user SET tsdb_admin.read_only_role = true; COMMIT",
		"GRANT ALL ON t TO ro_user",
	} {
		if _, err := ca.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	dsnFor := func(user, password string, port int) string {
		return "postgresql://" + user + ":" + password + "@127.0.0.1:" + strconv.Itoa(port) +
			"/tsdb?sslmode=verify-full&sslrootcert=" + s.boot.CAFile + "&connect_timeout=5&default_query_exec_mode=simple_protocol"
	}
	// mustNotWrite tries the ways out of a read-only session, each followed
	// by an INSERT that must fail with 25006.
	mustNotWrite := func(t *testing.T, dsn string) {
		t.Helper()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer c.Close(ctx)
		for _, escape := range []string{
			"",
			"SET tsdb_admin.read_only_connection = off",
			"SET tsdb_admin.read_only_role = off",
			"SET default_transaction_read_only = off",
			"SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
			"SELECT set_config('default_transaction_read_only', 'off', false)",
			"RESET ALL",
			"SET ROLE tsdbadmin",
		} {
			if escape != "" {
				_, _ = c.Exec(ctx, escape)
			}
			for _, w := range []string{"INSERT INTO t VALUES (1)", "BEGIN READ WRITE; INSERT INTO t VALUES (1); COMMIT"} {
				if _, err := c.Exec(ctx, w); pgtest.SQLState(err) != "25006" {
					t.Errorf("after %q, %s: got %v, want 25006", escape, w, err)
				}
				_, _ = c.Exec(ctx, "ROLLBACK")
			}
		}
	}

	t.Run("ReadOnlyConnection", func(t *testing.T) { mustNotWrite(t, dsnFor("tsdbadmin", pw, a.Endpoint.Port)+tigerReadOnly) })
	t.Run("ReadOnlyRole", func(t *testing.T) { mustNotWrite(t, dsnFor("ro_user", "ro-password-1", a.Endpoint.Port)) })

	t.Run("ReplicaSetEndpoint", func(t *testing.T) {
		var rs replicaSet
		if code := s.call("POST", s.replicaSets(a.ServiceID), map[string]any{"name": "reads", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}, &rs); code != 202 {
			t.Fatalf("create replica set: %d %+v", code, rs)
		}
		s.waitReplicaSet(a.ServiceID, rs.ID, "active", 90*time.Second)
		mustNotWrite(t, dsnFor("tsdbadmin", pw, rs.Endpoint.Port)+tigerReadOnly)
		mustNotWrite(t, dsnFor("ro_user", "ro-password-1", rs.Endpoint.Port))
	})

	var poolerAddr string
	t.Run("Pooler", func(t *testing.T) {
		if code := s.call("POST", s.services()+"/"+a.ServiceID+"/enablePooler", nil, nil); code != 200 {
			t.Fatalf("enablePooler: %d", code)
		}
		poolerAddr = s.waitPooler(a.ServiceID, true, 30*time.Second)
		_, port, _ := net.SplitHostPort(poolerAddr)
		p, _ := strconv.Atoi(port)
		mustNotWrite(t, dsnFor("ro_user", "ro-password-1", p))
		// PgBouncer does not pass the startup option on: the login is refused.
		if c, err := pgx.Connect(ctx, dsnFor("tsdbadmin", pw, p)+tigerReadOnly); err == nil {
			defer c.Close(ctx)
			if _, err := c.Exec(ctx, "INSERT INTO t VALUES (1)"); pgtest.SQLState(err) != "25006" {
				t.Errorf("a read-only connection through the pooler wrote: %v", err)
			}
		}
		c, err := pgx.Connect(ctx, dsnFor("tsdbadmin", pw, p))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "GRANT pg_execute_server_program TO tsdbadmin"); pgtest.SQLState(err) != "42501" {
			t.Errorf("through the pooler, GRANT pg_execute_server_program: %v, want 42501", err)
		}
	})
	var rows int
	if err := ca.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&rows); err != nil || rows != 1 {
		t.Errorf("t has %d rows (%v), want 1: a read-only session wrote", rows, err)
	}

	t.Run("TLSSuites", func(t *testing.T) {
		if _, err := exec.LookPath("openssl"); err != nil {
			t.Skip("openssl is not installed")
		}
		endpoints := map[string][]string{
			"API":        {s.listen},
			"PostgreSQL": {net.JoinHostPort(a.Endpoint.Host, strconv.Itoa(a.Endpoint.Port)), "-starttls", "postgres"},
		}
		if poolerAddr != "" {
			endpoints["PgBouncer"] = []string{poolerAddr, "-starttls", "postgres"}
		}
		for name, ep := range endpoints {
			for _, c := range []struct {
				cipher string
				ok     bool
			}{
				{"ECDHE-ECDSA-AES128-SHA", false},
				{"ECDHE-ECDSA-AES256-SHA384", false},
				{"ECDHE-ECDSA-AES128-GCM-SHA256", true},
			} {
				args := append([]string{"s_client", "-connect", ep[0], "-tls1_2", "-cipher", c.cipher + ":@SECLEVEL=0"}, ep[1:]...)
				cmd := exec.Command("openssl", args...)
				cmd.Stdin = strings.NewReader("")
				out, err := cmd.CombinedOutput()
				if (err == nil) != c.ok {
					t.Errorf("%s, TLS 1.2 %s: openssl %v, want success %v:\n%s", name, c.cipher, err, c.ok, tail(out, 600))
				}
			}
		}
	})
}
