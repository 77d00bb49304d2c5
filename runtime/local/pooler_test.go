package local

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"dbcloud"
	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/internal/localtest"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"
	"dbcloud/tlsca"
)

// poolerFixture is a running service with its pooler enabled.
type poolerFixture struct {
	rt       *Runtime
	cfg      Config
	svc      *dbcloud.Service
	spec     postgres.Spec
	port     int
	ep       *dbcloud.Endpoint
	password string
	caFile   string
}

// mustPooler starts a real service of the given size and its pooler, and
// removes both when the test ends. It fails, not skips, when PgBouncer is
// missing.
func mustPooler(tb testing.TB, size dbcloud.Size) *poolerFixture {
	tb.Helper()
	ctx := context.Background()
	base := localtest.Base(tb)
	ca, err := tlsca.LoadOrCreateCA(filepath.Join(base, "ca"))
	if err != nil {
		tb.Fatal(err)
	}
	logger := localtest.Logger(tb)
	f := &poolerFixture{
		cfg:      Config{BinDir: pgbin.Dir(), DataDir: filepath.Join(base, "data"), Host: "127.0.0.1", CA: ca, Logger: logger},
		password: dbcloud.NewPassword(),
		caFile:   filepath.Join(base, "ca", tlsca.CAFile),
	}
	if f.rt, err = New(f.cfg); err != nil {
		tb.Fatal(err)
	}
	if !f.rt.poolers.Available() {
		tb.Fatal("PgBouncer 1.19 or newer is not installed (scripts/pgbouncer.sh builds it)")
	}
	tb.Cleanup(func() { f.rt.Close() })
	f.svc = &dbcloud.Service{
		ID:               fmt.Sprintf("pool%d", os.Getpid()),
		Endpoint:         &dbcloud.Endpoint{Host: "127.0.0.1", Port: localtest.FreePort(tb)},
		Spec:             dbcloud.ServiceSpec{Size: size, Environment: dbcloud.EnvProd, Running: true},
		PasswordVerifier: dbcloud.NewSCRAMVerifier(f.password),
	}
	tb.Cleanup(func() {
		if err := f.rt.stopPooler(context.Background(), f.svc.ID); err != nil {
			tb.Errorf("stop pooler: %v", err)
		}
		if err := f.rt.DeleteService(context.Background(), f.svc); err != nil {
			tb.Errorf("delete service: %v", err)
		}
	})
	if _, err := f.rt.EnsureService(ctx, f.svc); err != nil {
		tb.Fatal(err)
	}
	if f.spec, err = f.rt.preparePrimary(context.Background(), f.svc); err != nil {
		tb.Fatal(err)
	}
	// Enabled after the service runs: the pooler's port is the domain's to
	// claim (Service.PoolerPort); here it is passed directly.
	f.svc.Spec.Pooler = true
	f.port = localtest.FreePort(tb)
	begin := time.Now()
	if f.ep, err = f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("pooler up in %v", time.Since(begin))
	if f.ep == nil || f.ep.Port != f.port || f.ep.Host != "127.0.0.1" {
		tb.Fatalf("endpoint %+v, want 127.0.0.1:%d", f.ep, f.port)
	}
	return f
}

// dsn allows a connection 30 s: a backend's start (TLS, SCRAM, the
// guard's preload) has taken past 5 s under CI's load.
func (f *poolerFixture) dsn(user, password, db string, port int) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=verify-full sslrootcert=%s "+
		"connect_timeout=30 default_query_exec_mode=simple_protocol",
		port, postgres.QuoteDSN(user), postgres.QuoteDSN(password), postgres.QuoteDSN(db), postgres.QuoteDSN(f.caFile))
}

func (f *poolerFixture) connect(ctx context.Context, user, password, db string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, f.dsn(user, password, db, f.port))
}

func (f *poolerFixture) pid(tb testing.TB) int {
	tb.Helper()
	pid, ok := f.rt.poolers.PID(f.rt.poolerDir(f.svc.ID))
	if !ok {
		tb.Fatal("no pooler runs")
	}
	return pid
}

// mustQueryThrough connects through the pooler and checks that the session
// is tsdbadmin's, on the instance's unix socket, with TLS to the client.
func (f *poolerFixture) mustQueryThrough(tb testing.TB, password string) {
	tb.Helper()
	ctx := context.Background()
	c, err := f.connect(ctx, "tsdbadmin", password, "tsdb")
	if err != nil {
		tb.Fatalf("connect through the pooler: %v", err)
	}
	defer c.Close(ctx)
	if _, ok := c.PgConn().Conn().(*tls.Conn); !ok {
		tb.Errorf("client connection is %T, not TLS", c.PgConn().Conn())
	}
	var user, db string
	var unixSocket bool
	if err := c.QueryRow(ctx, `SELECT current_user::text, current_database()::text, inet_server_addr() IS NULL`).Scan(&user, &db, &unixSocket); err != nil {
		tb.Fatalf("query through the pooler: %v", err)
	}
	if user != "tsdbadmin" || db != "tsdb" || !unixSocket {
		tb.Errorf("session: user %s, database %s, unix socket %v; want tsdbadmin, tsdb, true", user, db, unixSocket)
	}
}

func mustFailLogin(tb testing.TB, f *poolerFixture, user, password, db, why string) {
	tb.Helper()
	c, err := f.connect(context.Background(), user, password, db)
	if err == nil {
		c.Close(context.Background())
		tb.Errorf("%s: login as %s to %s through the pooler succeeded", why, user, db)
		return
	}
	tb.Logf("%s: %v", why, err)
}

func TestPooler(t *testing.T) {
	f := mustPooler(t, dbcloud.SharedSize) // max_connections 25
	ctx := context.Background()

	t.Run("TLSAndTransactionMode", func(t *testing.T) {
		f.mustQueryThrough(t, f.password)
		if c, err := pgx.Connect(ctx, strings.Replace(f.dsn("tsdbadmin", f.password, "tsdb", f.port), "sslmode=verify-full", "sslmode=disable", 1)); err == nil {
			c.Close(ctx)
			t.Error("the pooler accepted a client without TLS")
		}
		// Transaction mode: a client keeps a server connection only for a
		// transaction, so two clients can share one backend in turn.
		a, err := f.connect(ctx, "tsdbadmin", f.password, "tsdb")
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		tx, err := a.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var inTx1, inTx2 int
		tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&inTx1)
		tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&inTx2)
		tx.Commit(ctx)
		if inTx1 != inTx2 || inTx1 == 0 {
			t.Errorf("one transaction ran on backends %d and %d", inTx1, inTx2)
		}
	})

	t.Run("PeerRolesRefused", func(t *testing.T) {
		mustFailLogin(t, f, "postgres", "x", "postgres", "superuser")
		mustFailLogin(t, f, postgres.PoolerRole, "x", "tsdb", "lookup role")
		mustFailLogin(t, f, "tsdbadmin", f.password, "pgbouncer", "admin console")
		mustFailLogin(t, f, "tsdbadmin", "wrong", "tsdb", "wrong password")
	})

	t.Run("LookupFunction", func(t *testing.T) {
		direct, err := pgx.Connect(ctx, f.dsn("tsdbadmin", f.password, "tsdb", f.svc.Endpoint.Port))
		if err != nil {
			t.Fatal(err)
		}
		defer direct.Close(ctx)
		// The lookup is dbcloud's alone: no tenant database gets a copy,
		// and a new database serves through the pooler at once.
		for _, db := range []string{"template1", "postgres", "tsdb"} {
			var n int
			if err := superQueryRow(ctx, f.rt.instances, f.spec, db, `SELECT count(*) FROM pg_namespace WHERE nspname = 'pgbouncer'`, &n); err != nil || n != 0 {
				t.Errorf("schema pgbouncer in %s: %d, %v; want none", db, n, err)
			}
		}
		if _, err := direct.Exec(ctx, `CREATE DATABASE fromtemplate`); err != nil {
			t.Fatal(err)
		}
		c, err := f.connect(ctx, "tsdbadmin", f.password, "fromtemplate")
		if err != nil {
			t.Errorf("new database through the pooler: %v", err)
		} else {
			c.Close(ctx)
		}
		// tsdbadmin's CREATEROLE reaches the lookup role in PostgreSQL 15,
		// but the guard refuses the grant. Should a membership exist anyway
		// (granted by hand as the superuser here), the lookup's database
		// still refuses tsdbadmin (pg_hba.conf), and the membership is
		// revoked at the next ensure.
		var pgErr *pgconn.PgError
		_, err = direct.Exec(ctx, `GRANT `+postgres.PoolerRole+` TO tsdbadmin`)
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("tsdbadmin grants itself the lookup role: %v, want insufficient_privilege", err)
		}
		if err := f.rt.instances.Exec(ctx, f.spec, "tsdb", `GRANT `+postgres.PoolerRole+` TO tsdbadmin`); err != nil {
			t.Fatal(err)
		}
		if c, err := pgx.Connect(ctx, f.dsn("tsdbadmin", f.password, postgres.PoolerDatabase, f.svc.Endpoint.Port)); err == nil {
			c.Close(ctx)
			t.Errorf("tsdbadmin, a member of the lookup role, connected to %s", postgres.PoolerDatabase)
		}
		if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		var member bool
		if err := direct.QueryRow(ctx, `SELECT pg_has_role('tsdbadmin', '`+postgres.PoolerRole+`', 'MEMBER')`).Scan(&member); err != nil || member {
			t.Errorf("after ensure, tsdbadmin is a member of the lookup role: %v, %v", member, err)
		}
	})

	t.Run("HijackedLookupGainsNothing", func(t *testing.T) {
		// In a database it makes from template0, tsdbadmin owns schema
		// pgbouncer and writes a lookup that vouches for any password.
		direct, err := pgx.Connect(ctx, f.dsn("tsdbadmin", f.password, "tsdb", f.svc.Endpoint.Port))
		if err != nil {
			t.Fatal(err)
		}
		defer direct.Close(ctx)
		if _, err := direct.Exec(ctx, `CREATE DATABASE evil TEMPLATE template0`); err != nil {
			t.Fatal(err)
		}
		evil, err := pgx.Connect(ctx, f.dsn("tsdbadmin", f.password, "evil", f.svc.Endpoint.Port))
		if err != nil {
			t.Fatal(err)
		}
		defer evil.Close(ctx)
		fake := dbcloud.NewSCRAMVerifier("hijack")
		if _, err := evil.Exec(ctx, `CREATE SCHEMA pgbouncer; GRANT USAGE ON SCHEMA pgbouncer TO PUBLIC; CREATE FUNCTION pgbouncer.get_auth(text) RETURNS TABLE (usename name, passwd text)
			LANGUAGE sql AS $$ SELECT $1::name, '`+fake+`'::text $$`); err != nil {
			t.Fatal(err)
		}
		if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		mustFailLogin(t, f, "postgres", "hijack", "evil", "superuser vouched for by a fake lookup")
		mustFailLogin(t, f, postgres.PoolerRole, "hijack", "evil", "lookup role vouched for by a fake lookup")
		mustFailLogin(t, f, postgres.ReplicatorRole, "hijack", "evil", "replication role vouched for by a fake lookup")
		mustFailLogin(t, f, "tsdbadmin", "hijack", "evil", "tsdbadmin with a fake verifier (the server checks)")
	})

	t.Run("PasswordChange", func(t *testing.T) {
		newPW := dbcloud.NewPassword()
		if err := f.rt.SetPassword(ctx, f.svc, dbcloud.NewSCRAMVerifier(newPW)); err != nil {
			t.Fatal(err)
		}
		f.mustQueryThrough(t, newPW)
		mustFailLogin(t, f, "tsdbadmin", f.password, "tsdb", "old password")
		f.password = newPW
		f.mustQueryThrough(t, f.password)
	})

	t.Run("IdempotentReloadAdopt", func(t *testing.T) {
		pid := f.pid(t)
		if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		if got := f.pid(t); got != pid {
			t.Errorf("an unchanged ensure restarted the pooler: pid %d -> %d", pid, got)
		}
		// A new pool size is a reload (SIGHUP), not a restart.
		changed := f.spec
		changed.Settings = map[string]string{}
		for k, v := range f.spec.Settings {
			changed.Settings[k] = v
		}
		changed.Settings["max_connections"] = "50"
		if _, err := f.rt.ensurePooler(ctx, f.svc, changed, changed, f.port); err != nil {
			t.Fatal(err)
		}
		ini, _ := os.ReadFile(filepath.Join(f.rt.poolerDir(f.svc.ID), "pgbouncer.ini"))
		if got := f.pid(t); got != pid || !strings.Contains(string(ini), "default_pool_size = 35\n") {
			t.Errorf("after a pool size change: pid %d -> %d, ini has size 35: %v", pid, got, strings.Contains(string(ini), "default_pool_size = 35\n"))
		}
		f.mustQueryThrough(t, f.password)
		// A new control plane adopts the running pooler.
		rt2, err := New(f.cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer rt2.Close()
		if _, err := rt2.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		if got := f.pid(t); got != pid {
			t.Errorf("a new runtime restarted the pooler: pid %d -> %d", pid, got)
		}
		f.mustQueryThrough(t, f.password)
	})

	t.Run("PortChangeRestarts", func(t *testing.T) {
		pid := f.pid(t)
		old := f.port
		f.port = localtest.FreePort(t)
		if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		if got := f.pid(t); got == pid {
			t.Error("a new listen port did not restart the pooler")
		}
		f.mustQueryThrough(t, f.password)
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(old), time.Second); err == nil {
			c.Close()
			t.Errorf("old port %d still accepts", old)
		}
	})

	t.Run("CrashRecovery", func(t *testing.T) {
		pid := f.pid(t)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for f.rt.poolerRunning(f.svc.ID) {
			if time.Now().After(deadline) {
				t.Fatal("killed pooler still counts as running")
			}
			time.Sleep(proc.PollInterval)
		}
		if _, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port); err != nil {
			t.Fatal(err)
		}
		f.mustQueryThrough(t, f.password)
	})

	t.Run("Disable", func(t *testing.T) {
		pid := f.pid(t)
		f.svc.Spec.Pooler = false
		ep, err := f.rt.ensurePooler(ctx, f.svc, f.spec, f.spec, f.port)
		if err != nil || ep != nil {
			t.Fatalf("disable: %v, %v", ep, err)
		}
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(f.port), time.Second); err == nil {
			c.Close()
			t.Errorf("port %d still accepts after disable", f.port)
		}
		if proc.Alive(pid) {
			t.Errorf("pgbouncer %d still alive", pid)
		}
		if _, err := os.Stat(f.rt.poolerDir(f.svc.ID)); !os.IsNotExist(err) {
			t.Errorf("pooler directory remains: %v", err)
		}
		if cg := f.rt.cgroups.Of(f.svc.ID + "-pooler"); cg != nil && cg.Exists() {
			t.Error("pooler cgroup remains")
		}
		// Direct connections are unaffected.
		c, err := pgx.Connect(ctx, f.dsn("tsdbadmin", f.password, "tsdb", f.svc.Endpoint.Port))
		if err != nil {
			t.Fatal(err)
		}
		c.Close(ctx)
	})
}

// connectQueryRow runs one query as the superuser on database db.
func superQueryRow(ctx context.Context, m *postgres.Instances, s postgres.Spec, db, sql string, dest ...any) error {
	conn, err := m.Connect(ctx, s, db)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

// BenchmarkPoolerConnect compares a new connection plus one query, and one
// query on an open connection, directly and through the pooler, on a
// service of size 2000/8 (a CPU quota of both cores of the test machine: a
// smaller quota throttles the direct path's TLS and backend forks).
// Run: go test -run '^$' -bench PoolerConnect -benchtime 300x ./runtime/local/
func BenchmarkPoolerConnect(b *testing.B) {
	f := mustPooler(b, dbcloud.Size{CPUMillis: 2000, MemoryGBs: 8})
	ctx := context.Background()
	for _, target := range []struct {
		name string
		port int
	}{{"direct", f.svc.Endpoint.Port}, {"pooler", f.port}} {
		dsn := f.dsn("tsdbadmin", f.password, "tsdb", target.port)
		b.Run("connect+query/"+target.name, func(b *testing.B) {
			for b.Loop() {
				c, err := pgx.Connect(ctx, dsn)
				if err != nil {
					b.Fatal(err)
				}
				var one int
				if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
					b.Fatal(err)
				}
				c.Close(ctx)
			}
		})
		b.Run("query/"+target.name, func(b *testing.B) {
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(ctx)
			for b.Loop() {
				var one int
				if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
