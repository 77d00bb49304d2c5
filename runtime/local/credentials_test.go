package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/internal/pgtest"
	"dbcloud/runtime/local/internal/localtest"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"
)

// testCredential is a credential role with its password, for logging in.
type testCredential struct {
	dbcloud.CredentialRole
	password string
}

func newTestCredential(id string, readOnly bool, expires time.Time) testCredential {
	pw := dbcloud.NewPassword()
	return testCredential{password: pw, CredentialRole: dbcloud.CredentialRole{
		Username: dbcloud.CredentialUsername(id), Verifier: dbcloud.NewSCRAMVerifier(pw), ReadOnly: readOnly, Expires: expires,
	}}
}

func credentialRoles(creds ...testCredential) []dbcloud.CredentialRole {
	out := make([]dbcloud.CredentialRole, len(creds))
	for i, c := range creds {
		out[i] = c.CredentialRole
	}
	return out
}

// pollUntil calls ok until it holds or the deadline passes.
func pollUntil(tb testing.TB, what string, within time.Duration, ok func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(within); !ok(); time.Sleep(proc.PollInterval) {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %v", what, within)
		}
	}
}

// TestCredentials_EndpointAndPooler: credential roles log in over the
// endpoint (TLS, verify-full) and through the pooler; an expired one is
// refused by both; their last logins come from PostgreSQL's own lines,
// which a tenant's RAISE cannot forge; a revocation ends the open sessions
// on both paths and removes the roles; and a stopped service refuses a
// sync with a conflict.
func TestCredentials_EndpointAndPooler(t *testing.T) {
	f := mustPooler(t, dbcloud.SharedSize)
	ctx := context.Background()
	begin := time.Now().Add(-time.Second)
	admin := f.mustDirect(t, "tsdb")
	ro := newTestCredential("ro00000001", true, time.Now().Add(time.Hour))
	rw := newTestCredential("rw00000001", false, time.Now().Add(time.Hour))
	soon := newTestCredential("so00000001", true, time.Now().Add(3*time.Second))
	expired := newTestCredential("ex00000001", true, time.Now().Add(-time.Minute))
	// The service layer's sync and the engine's round may meet: both
	// succeed, one after the other.
	errs := make(chan error, 4)
	for range cap(errs) {
		go func() { errs <- f.rt.SyncCredentials(ctx, f.svc, credentialRoles(ro, rw, soon)) }()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Errorf("concurrent syncs: %v", err)
		}
	}
	// A role that expired while nobody synced: it exists, past VALID UNTIL.
	mustApplyCredentials(t, f, ro, rw, soon, expired)
	var roPass, expiredPass *string
	if err := superQueryRow(ctx, f.rt.instances, f.spec, postgres.PoolerDatabase,
		`SELECT (SELECT passwd FROM pgbouncer.get_auth(`+postgres.QuoteLiteral(ro.Username)+`)),
			(SELECT passwd FROM pgbouncer.get_auth(`+postgres.QuoteLiteral(expired.Username)+`))`,
		&roPass, &expiredPass); err != nil {
		t.Fatal(err)
	}
	if roPass == nil || expiredPass != nil {
		t.Errorf("the pooler's lookup answers %v for a live credential and %v for an expired one; want its verifier, then nothing", roPass, expiredPass)
	}
	if _, err := admin.Exec(ctx, `CREATE TABLE t(v text); INSERT INTO t VALUES ('x')`); err != nil {
		t.Fatal(err)
	}
	// A tenant forging a login line of a credential that never logged in.
	if _, err := admin.Exec(ctx, `DO $$ BEGIN RAISE LOG 'credential login: user=dbcloud_cred_forged0001 database=tsdb'; END $$`); err != nil {
		t.Fatal(err)
	}

	direct := map[string]*pgx.Conn{}
	pooled := map[string]*pgx.Conn{}
	soonConn, err := pgx.Connect(ctx, f.dsn(soon.Username, soon.password, "tsdb", f.svc.Endpoint.Port))
	if err != nil {
		t.Fatalf("%s over the endpoint: %v", soon.Username, err)
	}
	defer soonConn.Close(ctx)
	for _, c := range []testCredential{ro, rw} {
		d, err := pgx.Connect(ctx, f.dsn(c.Username, c.password, "tsdb", f.svc.Endpoint.Port))
		if err != nil {
			t.Fatalf("%s over the endpoint: %v", c.Username, err)
		}
		t.Cleanup(func() { d.Close(context.Background()) })
		p, err := f.connect(ctx, c.Username, c.password, "tsdb")
		if err != nil {
			t.Fatalf("%s through the pooler: %v", c.Username, err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		for path, conn := range map[string]*pgx.Conn{"endpoint": d, "pooler": p} {
			var user, v string
			if err := conn.QueryRow(ctx, `SELECT current_user::text, v FROM t`).Scan(&user, &v); err != nil || user != c.Username || v != "x" {
				t.Errorf("%s through the %s: %q read %q, %v", c.Username, path, user, v, err)
			}
			_, err := conn.Exec(ctx, `INSERT INTO t VALUES ('y')`)
			if c.ReadOnly && pgtest.SQLState(err) != "25006" {
				t.Errorf("READ_ONLY through the %s: INSERT: %v, want 25006", path, err)
			}
			if !c.ReadOnly && err != nil {
				t.Errorf("READ_WRITE through the %s: INSERT: %v", path, err)
			}
		}
		direct[c.Username], pooled[c.Username] = d, p
	}
	if c, err := pgx.Connect(ctx, f.dsn(expired.Username, expired.password, "tsdb", f.svc.Endpoint.Port)); err == nil {
		c.Close(ctx)
		t.Error("an expired credential logged in over the endpoint")
	}
	mustFailLogin(t, f, expired.Username, expired.password, "tsdb", "expired credential")

	var logins map[string]time.Time
	pollUntil(t, "both logins in the logs", 10*time.Second, func() bool {
		var err error
		if logins, err = f.rt.CredentialLogins(ctx, f.svc); err != nil {
			t.Fatal(err)
		}
		return !logins[ro.Username].IsZero() && !logins[rw.Username].IsZero()
	})
	for name, at := range logins {
		if name != ro.Username && name != rw.Username && name != soon.Username {
			t.Errorf("a login of %s at %v: only %s and %s logged in", name, at, ro.Username, rw.Username)
		} else if at.Before(begin) {
			t.Errorf("%s last logged in at %v, before the test began (%v)", name, at, begin)
		}
	}

	// Expired, still listed: its session ends and it goes, as does the
	// role that expired unsynced.
	pollUntil(t, "the credential's expiry", 10*time.Second, func() bool { return time.Now().After(soon.Expires) })
	if err := f.rt.SyncCredentials(ctx, f.svc, credentialRoles(ro, rw, soon, expired)); err != nil {
		t.Fatal(err)
	}
	if _, err := soonConn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("the expired credential's session still answers")
	}
	var gone int
	if err := superQueryRow(ctx, f.rt.instances, f.spec, "postgres", `SELECT count(*) FROM pg_roles WHERE rolname IN (`+
		postgres.QuoteLiteral(soon.Username)+`, `+postgres.QuoteLiteral(expired.Username)+`)`, &gone); err != nil || gone != 0 {
		t.Errorf("%d expired credential roles left (%v)", gone, err)
	}

	// Revoked: the open sessions end on both paths, and no new one starts.
	if err := f.rt.SyncCredentials(ctx, f.svc, credentialRoles(rw)); err != nil {
		t.Fatal(err)
	}
	for path, conn := range map[string]*pgx.Conn{"endpoint": direct[ro.Username], "pooler": pooled[ro.Username]} {
		if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
			t.Errorf("the revoked credential's session through the %s still answers", path)
		}
	}
	if _, err := direct[rw.Username].Exec(ctx, "SELECT 1"); err != nil {
		t.Errorf("the credential still live lost its session: %v", err)
	}
	mustFailLogin(t, f, ro.Username, ro.password, "tsdb", "revoked credential")
	if c, err := pgx.Connect(ctx, f.dsn(ro.Username, ro.password, "tsdb", f.svc.Endpoint.Port)); err == nil {
		c.Close(ctx)
		t.Error("a revoked credential logged in over the endpoint")
	}
	if err := f.rt.SyncCredentials(ctx, f.svc, nil); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := superQueryRow(ctx, f.rt.instances, f.spec, "postgres", `SELECT count(*) FROM pg_roles WHERE rolname LIKE 'dbcloud\_cred\_%'`, &left); err != nil || left != 0 {
		t.Errorf("%d credential roles left after revoking all (%v)", left, err)
	}

	// Stopped: a conflict, nothing changed.
	f.svc.Spec.Running = false
	if _, err := f.rt.EnsureService(ctx, f.svc); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.SyncCredentials(ctx, f.svc, credentialRoles(rw)); !dbcloud.IsConflict(err) {
		t.Errorf("sync on a stopped service: %v, want a conflict", err)
	}
	if logins, err := f.rt.CredentialLogins(ctx, f.svc); err != nil || logins[rw.Username].IsZero() {
		t.Errorf("last logins of a stopped service: %v, %v", logins, err)
	}

	// Deleted: nothing of it is remembered.
	if err := f.rt.DeleteService(ctx, f.svc); err != nil {
		t.Fatal(err)
	}
	f.rt.credLogins.mu.Lock()
	_, kept := f.rt.credLogins.seen[f.svc.ID]
	f.rt.credLogins.mu.Unlock()
	if kept {
		t.Errorf("the last logins of deleted service %s are still kept", f.svc.ID)
	}
}

// mustApplyCredentials makes the roles on the fixture's primary directly,
// expired or not, as they may be found there.
func mustApplyCredentials(t *testing.T, f *poolerFixture, creds ...testCredential) {
	t.Helper()
	ctx := context.Background()
	conn, err := f.rt.instances.Connect(ctx, f.spec, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	want := make([]postgres.CredentialRole, len(creds))
	for i, c := range creds {
		want[i] = postgres.CredentialRole{Name: c.Username, Verifier: c.Verifier, ReadOnly: c.ReadOnly, Expires: c.Expires}
	}
	if _, err := postgres.ApplyCredentials(ctx, conn, want); err != nil {
		t.Fatal(err)
	}
}

// TestCredentials_HAStandby: a READ_ONLY credential's session on an HA
// standby ends when the credential is revoked, and it cannot log in there
// again.
func TestCredentials_HAStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PostgreSQL instances")
	}
	ctx := context.Background()
	rt := mustRuntime(t, localtest.Base(t))
	const password = "credha-password"
	svc := haTestService(t, rt, "credha0001", password, 1, 0)
	st, err := rt.loadHA(svc.ID)
	if err != nil || st == nil {
		t.Fatalf("ha state: %+v, %v", st, err)
	}
	standby := -1
	for _, n := range st.Members {
		if n != st.Primary {
			standby = n
		}
	}
	ro := newTestCredential("ha00000001", true, time.Now().Add(time.Hour))
	if err := rt.SyncCredentials(ctx, svc, credentialRoles(ro)); err != nil {
		t.Fatal(err)
	}
	dsn := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%s/tsdb?sslmode=require&connect_timeout=5", ro.Username, ro.password, strconv.Itoa(st.Ports[standby]))
	var conn *pgx.Conn
	pollUntil(t, "the credential logs in on the standby", 20*time.Second, func() bool {
		conn, err = pgx.Connect(ctx, dsn)
		return err == nil
	})
	defer conn.Close(ctx)
	var recovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery); err != nil || !recovery {
		t.Fatalf("session on the standby: in recovery %v, %v", recovery, err)
	}
	if err := rt.SyncCredentials(ctx, svc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("the revoked credential's session on the standby still answers")
	}
	if c, err := pgx.Connect(ctx, dsn); err == nil {
		c.Close(ctx)
		t.Error("the revoked credential logged in on the standby")
	}
}

// TestCredentials_ForkDoesNotInherit: a fork's data holds its parent's
// credential roles; they are dropped on the fork's first start, so the
// parent's credential never logs in to the fork.
func TestCredentials_ForkDoesNotInherit(t *testing.T) {
	ctx := context.Background()
	rt := mustRuntime(t, localtest.Base(t))
	parent := newTestService(t, rt, "credparent", "parent-password", nil)
	mustEnsure(t, rt, parent)
	cred := newTestCredential("fk00000001", false, time.Now().Add(time.Hour))
	if err := rt.SyncCredentials(ctx, parent, credentialRoles(cred)); err != nil {
		t.Fatal(err)
	}
	fork := newTestService(t, rt, "credfork01", "fork-password", &dbcloud.ForkSource{ServiceID: parent.ID, Strategy: dbcloud.ForkNow})
	mustEnsure(t, rt, fork)
	dsn := func(svc *dbcloud.Service) string {
		return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/tsdb?sslmode=require&connect_timeout=5", cred.Username, cred.password, svc.Endpoint.Port)
	}
	if c, err := pgx.Connect(ctx, dsn(fork)); err == nil {
		c.Close(ctx)
		t.Error("the parent's credential logged in to the fork")
	} else {
		t.Logf("on the fork: %v", err)
	}
	c, err := pgx.Connect(ctx, dsn(parent))
	if err != nil {
		t.Fatalf("the credential on its own service: %v", err)
	}
	c.Close(ctx)
}

// TestCredentials_ReplicaSet: a READ_ONLY credential logs in on a read
// replica set's endpoint, its login there is reported, and a revocation
// ends its session on the node.
func TestCredentials_ReplicaSet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PostgreSQL instances")
	}
	ctx := context.Background()
	rt := mustRuntime(t, localtest.Base(t))
	parent := newTestService(t, rt, "credrsparent", "parent-password", nil)
	mustEnsure(t, rt, parent)
	set := &dbcloud.ReadReplicaSet{
		ID: fmt.Sprintf("credrs%d", os.Getpid()), ServiceID: parent.ID, Status: dbcloud.ReplicaSetCreating,
		Spec:     dbcloud.ReadReplicaSetSpec{Size: dbcloud.Size{Shared: true}, Nodes: 1},
		Endpoint: &dbcloud.Endpoint{Host: "127.0.0.1", Port: localtest.FreePort(t)},
	}
	t.Cleanup(func() {
		if err := rt.DeleteReplicaSet(context.Background(), parent, set); err != nil {
			t.Errorf("delete replica set: %v", err)
		}
	})
	if _, err := rt.EnsureReplicaSet(ctx, parent, set); err != nil {
		t.Fatal(err)
	}
	ro := newTestCredential("rs00000001", true, time.Now().Add(time.Hour))
	if err := rt.SyncCredentials(ctx, parent, credentialRoles(ro)); err != nil {
		t.Fatal(err)
	}
	dsn := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/tsdb?sslmode=require&connect_timeout=5", ro.Username, ro.password, set.Endpoint.Port)
	var conn *pgx.Conn
	var err error
	pollUntil(t, "the credential logs in on the replica set", 20*time.Second, func() bool {
		conn, err = pgx.Connect(ctx, dsn)
		return err == nil
	})
	defer conn.Close(ctx)
	var recovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery); err != nil || !recovery {
		t.Fatalf("session on the replica set: in recovery %v, %v", recovery, err)
	}
	pollUntil(t, "the login on the node in the last logins", 10*time.Second, func() bool {
		logins, err := rt.CredentialLogins(ctx, parent)
		if err != nil {
			t.Fatal(err)
		}
		return !logins[ro.Username].IsZero()
	})
	if err := rt.SyncCredentials(ctx, parent, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("the revoked credential's session on the replica set still answers")
	}
	if c, err := pgx.Connect(ctx, dsn); err == nil {
		c.Close(ctx)
		t.Error("the revoked credential logged in on the replica set")
	}
}

// TestCredentials_RevocationNotHeldUp: a live role that cannot be changed
// now (its catalog row locked by another transaction, past dbcloud's lock
// timeout) makes the sync fail, but the revoked role beside it is still
// dropped.
func TestCredentials_RevocationNotHeldUp(t *testing.T) {
	ctx := context.Background()
	rt := mustRuntime(t, localtest.Base(t))
	svc := newTestService(t, rt, "credlock01", "lock-password", nil)
	mustEnsure(t, rt, svc)
	stuck := newTestCredential("st00000001", true, time.Now().Add(time.Hour))
	revoked := newTestCredential("rv00000001", true, time.Now().Add(time.Hour))
	if err := rt.SyncCredentials(ctx, svc, credentialRoles(stuck, revoked)); err != nil {
		t.Fatal(err)
	}
	spec, err := rt.primary(svc)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := rt.instances.Connect(ctx, spec, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "ALTER ROLE "+stuck.Username+" CONNECTION LIMIT 5"); err != nil {
		t.Fatal(err)
	}
	stuck.Expires = stuck.Expires.Add(time.Hour) // a change the sync must write
	err = rt.SyncCredentials(ctx, svc, credentialRoles(stuck))
	if err == nil {
		t.Fatal("the sync succeeded with the live role's row locked")
	}
	t.Logf("sync: %v", err)
	var left int
	if err := superQueryRow(ctx, rt.instances, spec, "postgres",
		`SELECT count(*) FROM pg_roles WHERE rolname = `+postgres.QuoteLiteral(revoked.Username), &left); err != nil || left != 0 {
		t.Errorf("the revoked role is still there (%d, %v)", left, err)
	}
	// The failed statement carried the verifier: the tenant-readable log
	// has the error, not the statement.
	var logs string
	pollUntil(t, "the lock timeout in the log", 10*time.Second, func() bool {
		files, _ := filepath.Glob(filepath.Join(spec.LogDir(), "*.json"))
		var b strings.Builder
		for _, f := range files {
			data, _ := os.ReadFile(f)
			b.Write(data)
		}
		logs = b.String()
		return strings.Contains(logs, "canceling statement due to lock timeout")
	})
	if strings.Contains(logs, stuck.Verifier) {
		t.Error("the server log holds the credential's verifier")
	}
}
