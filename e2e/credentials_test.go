package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

type credentialJSON struct {
	ID               string    `json:"id"`
	Username         string    `json:"username"`
	Password         string    `json:"password"`
	Access           string    `json:"access"`
	Expires          time.Time `json:"expires"`
	ConnectionString string    `json:"connection_string"`
	Code             string    `json:"code"`
}

// credentialDSN is the credential's connection string for addr (host:port),
// verified against the CA; simple is for PgBouncer in transaction mode.
func (s *server) credentialDSN(c credentialJSON, addr string, simple bool) string {
	u, err := url.Parse(c.ConnectionString)
	if err != nil {
		s.t.Fatalf("connection string %q: %v", c.ConnectionString, err)
	}
	u.Host = addr
	u.RawQuery = s.sslParams() + "&connect_timeout=10"
	if simple {
		u.RawQuery += "&default_query_exec_mode=simple_protocol"
	}
	return u.String()
}

// sqlState is the SQLSTATE of err, "" when it has none.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// TestCredentials: database credentials on real PostgreSQL (decisions.md
// section 12). A READ_ONLY one reads a table made after it, through the
// endpoint, the pooler and a read replica set, and no escape makes its
// session writable; a READ_WRITE one writes, and what it made passes to
// tsdbadmin when it is revoked, which ends its open session at once; a
// viewer is refused a READ_WRITE one (403); and credentials that expire
// while dbcloud is down end their open sessions and lose their roles on
// the next round after it starts, while a live one keeps working.
func TestCredentials(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "creds", "cpu_millis": "shared", "replica_count": 1})
	svc := s.waitStatus(created.ServiceID, "READY", readyWithin())
	path := s.services() + "/" + svc.ServiceID
	admin := s.mustConnect(svc, created.InitialPassword)
	for _, q := range []string{
		"CREATE TABLE before_cred (x int)", "INSERT INTO before_cred VALUES (1)",
		// A function of tsdbadmin's that writes, run with its rights.
		"CREATE FUNCTION write_for_me() RETURNS void LANGUAGE sql SECURITY DEFINER AS 'INSERT INTO before_cred VALUES (99)'",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if code := s.call("POST", path+"/enablePooler", nil, nil); code != 200 && code != 202 {
		t.Fatalf("enablePooler: %d", code)
	}
	poolerAddr := s.waitPooler(svc.ServiceID, true, 60*time.Second)
	var set replicaSet
	if code := s.call("POST", s.replicaSets(svc.ServiceID), map[string]any{"name": "reads", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}, &set); code != 202 {
		t.Fatalf("create replica set: %d", code)
	}
	set = s.waitReplicaSet(svc.ServiceID, set.ID, "active", 120*time.Second)
	s.waitStatus(svc.ServiceID, "READY", 60*time.Second)

	// A viewer may make READ_ONLY credentials only.
	var viewer key
	if err := json.Unmarshal(s.admin("key", "create", "--project", s.boot.ProjectID, "--name", "viewer", "--role", "viewer"), &viewer); err != nil {
		t.Fatal(err)
	}
	var refused credentialJSON
	if code, _ := s.doAs(viewer, "POST", path+"/credentials", map[string]any{"name": "w", "access": "READ_WRITE"}, &refused); code != 403 {
		t.Fatalf("viewer's READ_WRITE credential: %d %+v, want 403", code, refused)
	}
	var ro, expiring, rw, lasting credentialJSON
	if code, err := s.doAs(viewer, "POST", path+"/credentials", map[string]any{"name": "agent", "access": "READ_ONLY", "ttl_seconds": 60}, &ro); code != 201 {
		t.Fatalf("viewer's READ_ONLY credential: %d %v", code, err)
	}
	for _, c := range []struct {
		out  *credentialJSON
		body map[string]any
	}{
		{&expiring, map[string]any{"name": "short", "ttl_seconds": 60}},
		{&rw, map[string]any{"name": "writer", "access": "READ_WRITE", "ttl_seconds": 3600}},
		{&lasting, map[string]any{"name": "lasting", "ttl_seconds": 3600}},
	} {
		if code := s.call("POST", path+"/credentials", c.body, c.out); code != 201 || c.out.Password == "" {
			t.Fatalf("create credential %v: %d %+v", c.body, code, *c.out)
		}
	}
	if _, err := admin.Exec(ctx, "CREATE TABLE after_cred (x int); INSERT INTO after_cred VALUES (2)"); err != nil {
		t.Fatal(err)
	}

	endpoint := net.JoinHostPort(svc.Endpoint.Host, strconv.Itoa(svc.Endpoint.Port))
	roConn, err := pgx.Connect(ctx, s.credentialDSN(ro, endpoint, false))
	if err != nil {
		t.Fatalf("READ_ONLY login through the endpoint: %v", err)
	}
	defer roConn.Close(ctx)
	var n int
	if err := roConn.QueryRow(ctx, "SELECT (SELECT count(*) FROM before_cred) + (SELECT count(*) FROM after_cred)").Scan(&n); err != nil || n != 2 {
		t.Fatalf("READ_ONLY reads %d rows (%v), want both tables' rows, also the table made after it", n, err)
	}
	// Every escape is refused or leaves the session read-only: the write
	// after it still fails.
	for _, escape := range []string{
		"SET default_transaction_read_only = off",
		"SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
		"SET ROLE tsdbadmin",
		"SET SESSION AUTHORIZATION tsdbadmin",
		"RESET ALL",
		"SELECT set_config('default_transaction_read_only', 'off', false)",
	} {
		_, eerr := roConn.Exec(ctx, escape)
		_, werr := roConn.Exec(ctx, "INSERT INTO after_cred VALUES (3)")
		if werr == nil {
			t.Errorf("READ_ONLY wrote after %q (which answered %v)", escape, eerr)
		}
	}
	if _, err := roConn.Exec(ctx, "BEGIN READ WRITE; INSERT INTO after_cred VALUES (4); COMMIT"); err == nil {
		t.Error("READ_ONLY wrote in a READ WRITE transaction")
	}
	roConn.Exec(ctx, "ROLLBACK")
	if _, err := roConn.Exec(ctx, "SELECT write_for_me()"); err == nil {
		t.Error("READ_ONLY wrote through tsdbadmin's SECURITY DEFINER function")
	}
	var rows int
	admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM before_cred) + (SELECT count(*) FROM after_cred)").Scan(&rows)
	if rows != 2 {
		t.Errorf("tables hold %d rows after the READ_ONLY session's attempts, want 2", rows)
	}

	// Through the pooler and on the read replica set.
	poolConn, err := pgx.Connect(ctx, s.credentialDSN(ro, poolerAddr, true))
	if err != nil {
		t.Fatalf("READ_ONLY login through the pooler: %v", err)
	}
	if err := poolConn.QueryRow(ctx, "SELECT count(*) FROM after_cred").Scan(&n); err != nil || n != 1 {
		t.Errorf("READ_ONLY through the pooler: %d %v", n, err)
	}
	poolConn.Close(ctx)
	setAddr := net.JoinHostPort(set.Endpoint.Host, strconv.Itoa(set.Endpoint.Port))
	var setConn *pgx.Conn
	waitFor(t, "the READ_ONLY credential reads after_cred on the read replica set", 60*time.Second, func() bool {
		if setConn == nil {
			if setConn, err = pgx.Connect(ctx, s.credentialDSN(ro, setAddr, false)); err != nil {
				setConn = nil
				return false
			}
		}
		return setConn.QueryRow(ctx, "SELECT count(*) FROM after_cred").Scan(&n) == nil && n == 1
	})
	defer setConn.Close(ctx)

	// READ_WRITE writes and makes a table; revoked, its open session ends
	// before the 204 and its table passes to tsdbadmin.
	rwConn, err := pgx.Connect(ctx, s.credentialDSN(rw, endpoint, false))
	if err != nil {
		t.Fatalf("READ_WRITE login: %v", err)
	}
	defer rwConn.Close(ctx)
	if _, err := rwConn.Exec(ctx, "INSERT INTO after_cred VALUES (5); CREATE TABLE made_by_rw (x int)"); err != nil {
		t.Fatalf("READ_WRITE writes: %v", err)
	}
	if code := s.call("DELETE", path+"/credentials/"+rw.ID, nil, nil); code != 204 {
		t.Fatalf("revoke: %d", code)
	}
	if _, err := rwConn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("the revoked credential's open session still answers after the 204")
	}
	if c, err := pgx.Connect(ctx, s.credentialDSN(rw, endpoint, false)); err == nil {
		c.Close(ctx)
		t.Error("the revoked credential logs in")
	} else if st := sqlState(err); st != "28P01" && st != "28000" {
		t.Errorf("the revoked credential's login fails with %v, want an authentication failure", err)
	}
	var owner string
	if err := admin.QueryRow(ctx, "SELECT tableowner FROM pg_tables WHERE tablename = 'made_by_rw'").Scan(&owner); err != nil || owner != "tsdbadmin" {
		t.Errorf("made_by_rw is owned by %q (%v), want tsdbadmin", owner, err)
	}

	// Expiry while dbcloud is down: stop it before the two short ones
	// expire, start it after; their sessions end and their roles go on
	// the next round, and the lasting one keeps working.
	s.stop()
	for time.Now().Before(expiring.Expires.Add(2 * time.Second)) {
		time.Sleep(200 * time.Millisecond)
	}
	s.start()
	deadline := time.Now().Add(60 * time.Second)
	waitFor(t, "the expired credentials' open sessions end", time.Until(deadline), func() bool {
		_, e1 := roConn.Exec(ctx, "SELECT 1")
		_, e2 := setConn.Exec(ctx, "SELECT 1")
		return e1 != nil && e2 != nil
	})
	waitFor(t, "the expired credentials' roles dropped", time.Until(deadline), func() bool {
		var left int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_roles WHERE rolname = ANY($1)", []string{ro.Username, expiring.Username, rw.Username}).Scan(&left)
		return err == nil && left == 0
	})
	for _, c := range []credentialJSON{ro, expiring} {
		if conn, err := pgx.Connect(ctx, s.credentialDSN(c, endpoint, false)); err == nil {
			conn.Close(ctx)
			t.Errorf("expired credential %s logs in", c.Username)
		}
	}
	lc, err := pgx.Connect(ctx, s.credentialDSN(lasting, endpoint, false))
	if err != nil {
		t.Fatalf("the lasting credential after the restart: %v", err)
	}
	lc.Close(ctx)
	var listed []credentialJSON
	s.call("GET", path+"/credentials", nil, &listed)
	if len(listed) != 1 || listed[0].ID != lasting.ID {
		t.Errorf("listed after expiry: %+v, want only the lasting credential", listed)
	}
	types := map[string]int{}
	for _, op := range s.operations(svc.ServiceID) {
		types[op.Type]++
	}
	if types["create_credential"] != 4 || types["revoke_credential"] != 1 || types["expire_credential"] != 2 {
		t.Errorf("credential operations of the service: %v, want 4 creates, 1 revocation, 2 expiries", types)
	}
}

// waitFor polls cond until it holds, or fails the test after within.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
