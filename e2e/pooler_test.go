package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pooledService is what GET shows of a service's pooler.
type pooledService struct {
	ServiceID        string `json:"service_id"`
	Status           string `json:"status"`
	ConnectionPooler *struct {
		Endpoint *struct {
			Host string `json:"host"`
			Port int    `json:"port"`
		} `json:"endpoint"`
	} `json:"connection_pooler"`
}

func (p pooledService) poolerAddr() string {
	if p.ConnectionPooler == nil || p.ConnectionPooler.Endpoint == nil {
		return ""
	}
	return net.JoinHostPort(p.ConnectionPooler.Endpoint.Host, strconv.Itoa(p.ConnectionPooler.Endpoint.Port))
}

// waitPooler polls the service until its pooler endpoint is shown (want)
// or gone (!want), and returns it.
func (s *server) waitPooler(id string, want bool, within time.Duration) string {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var p pooledService
		code := s.call("GET", s.services()+"/"+id, nil, &p)
		if addr := p.poolerAddr(); code == 200 && (addr != "") == want {
			return addr
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("service %s: pooler endpoint shown=%v not reached within %v (%d %+v)", id, want, within, code, p)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// poolerDSN logs in as a user would through the pooler: TLS (verified
// against the CA where the runtime's certificates are dbcloud's:
// sslParams), and the simple protocol, since PgBouncer 1.18 in
// transaction mode cannot carry prepared statements.
func (s *server) poolerDSN(addr, password string) string {
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("postgresql://tsdbadmin:%s@%s:%s/tsdb?%s&connect_timeout=30&default_query_exec_mode=simple_protocol",
		password, host, port, s.sslParams())
}

// stopPoolers kills, by PID, any PgBouncer a test left running under dir.
func stopPoolers(dir string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.HasPrefix(filepath.Base(exe), "pgbouncer") && strings.Contains(string(cmdline), dir+"/") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func TestPooler_ManyClients(t *testing.T) {
	t.Parallel()
	var dir string
	// Registered first, so it runs last: after the server's own cleanup.
	t.Cleanup(func() {
		if dir != "" {
			stopPoolers(dir)
		}
	})
	s := newServer(t)
	dir = s.dir
	ctx := context.Background()
	created := s.create(map[string]any{"name": "pooled", "cpu_millis": "2000", "memory_gbs": "8", "environment_tag": "PROD"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	pw := created.InitialPassword
	id := svc.ServiceID
	// Runs before the server's cleanup, whose deleteAll can only delete a
	// service it can set to DEV, which the pooler prevents.
	t.Cleanup(func() {
		s.do("POST", s.services()+"/"+id+"/disablePooler", nil, nil)
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if code, err := s.do("POST", s.services()+"/"+id+"/setEnvironment", map[string]string{"environment": "DEV"}, nil); err != nil || code == 200 {
				break
			}
		}
	})

	var maxConns string
	direct := s.mustConnect(svc, pw)
	if err := direct.QueryRow(ctx, `SHOW max_connections`).Scan(&maxConns); err != nil || maxConns != "100" {
		t.Fatalf("max_connections = %q (%v), want 100 for size 2000/8", maxConns, err)
	}

	begin := time.Now()
	if code := s.call("POST", s.services()+"/"+id+"/enablePooler", nil, nil); code != 200 {
		t.Fatalf("enablePooler: %d", code)
	}
	addr := s.waitPooler(id, true, 30*time.Second)
	t.Logf("pooler endpoint %s shown %v after enablePooler", addr, time.Since(begin).Round(time.Millisecond))
	if addr == net.JoinHostPort(svc.Endpoint.Host, strconv.Itoa(svc.Endpoint.Port)) {
		t.Fatalf("the pooler shares the service endpoint %s", addr)
	}

	t.Run("500Clients", func(t *testing.T) {
		const clients = 500
		dsn := s.poolerDSN(addr, pw)
		var (
			connected, done sync.WaitGroup
			release         = make(chan struct{})
			mu              sync.Mutex
			failures        []error
		)
		fail := func(err error) {
			mu.Lock()
			failures = append(failures, err)
			mu.Unlock()
		}
		begin := time.Now()
		connected.Add(clients)
		done.Add(clients)
		for i := range clients {
			go func() {
				defer done.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				c, err := pgx.Connect(ctx, dsn)
				if err != nil {
					connected.Done()
					fail(fmt.Errorf("client %d connect: %w", i, err))
					return
				}
				defer c.Close(context.Background())
				var n int
				err = c.QueryRow(ctx, `SELECT $1::int + 1`, i).Scan(&n)
				connected.Done()
				if err != nil || n != i+1 {
					fail(fmt.Errorf("client %d query: %d, %w", i, n, err))
					return
				}
				// Hold the connection until every client has one, then use
				// it once more.
				<-release
				if _, err := c.Exec(ctx, `SELECT pg_sleep(0.1)`); err != nil {
					fail(fmt.Errorf("client %d second query: %w", i, err))
				}
			}()
		}
		connected.Wait()
		took := time.Since(begin)
		// Every client now holds an open connection; then all of them run
		// a 100 ms query at once, which the pool must queue within its
		// size: count the service's backends meanwhile.
		count := func() int {
			var n int
			if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = 'tsdbadmin' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
				t.Error(err)
			}
			return n
		}
		idle := count()
		close(release)
		finished := make(chan struct{})
		go func() { done.Wait(); close(finished) }()
		peak := 0
		for waiting := true; waiting; {
			select {
			case <-finished:
				waiting = false
			case <-time.After(20 * time.Millisecond):
				peak = max(peak, count())
			}
		}
		t.Logf("%d clients connected and queried through the pooler in %v; with all of them open, %d backends; "+
			"while they all ran a 100 ms query, at most %d backends (max_connections %s); all done %v after the start",
			clients-len(failures), took.Round(time.Millisecond), idle, peak, maxConns, time.Since(begin).Round(time.Millisecond))
		if len(failures) > 0 {
			t.Errorf("%d of %d clients failed; first: %v", len(failures), clients, failures[0])
		}
		if peak >= 100 {
			t.Errorf("%d backends for %d pooled clients: the pool is not bounded under max_connections", peak, clients)
		}
	})

	poolerPid := func() int {
		raw, err := os.ReadFile(filepath.Join(s.dir, "runtime", "services", id, "pooler", "pgbouncer.pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	// mustPoolerQuery retries a connection through the pooler for a while.
	mustPoolerQuery := func(password string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			c, err := pgx.Connect(ctx, s.poolerDSN(addr, password))
			if err == nil {
				var one int
				err = c.QueryRow(ctx, `SELECT 1`).Scan(&one)
				c.Close(ctx)
				if err == nil {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no query through the pooler within %v: %v", within, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	t.Run("ServerRestartKeepsPooler", func(t *testing.T) {
		pid := poolerPid()
		s.restart()
		s.waitStatus(id, "READY", 30*time.Second)
		mustPoolerQuery(pw, 10*time.Second)
		if got := poolerPid(); got != pid {
			t.Errorf("the pooler was restarted with the control plane: pid %d -> %d", pid, got)
		}
	})

	t.Run("CrashedPoolerRestarts", func(t *testing.T) {
		pid := poolerPid()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		mustPoolerQuery(pw, 30*time.Second)
		t.Logf("pooler back %v after SIGKILL", time.Since(begin).Round(time.Millisecond))
		s.waitStatus(id, "READY", 30*time.Second)
	})

	t.Run("StopStart", func(t *testing.T) {
		s.call("POST", s.services()+"/"+id+"/stop", nil, nil)
		s.waitStatus(id, "PAUSED", 30*time.Second)
		if got := s.waitPooler(id, false, 5*time.Second); got != "" {
			t.Errorf("a PAUSED service shows pooler endpoint %s", got)
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("pooler port %s accepts while PAUSED", addr)
		}
		s.call("POST", s.services()+"/"+id+"/start", nil, nil)
		s.waitStatus(id, "READY", 30*time.Second)
		if got := s.waitPooler(id, true, 10*time.Second); got != addr {
			t.Errorf("pooler endpoint moved from %s to %s", addr, got)
		}
		mustPoolerQuery(pw, 5*time.Second)
	})

	t.Run("ResizeReloadsPooler", func(t *testing.T) {
		if code := s.call("POST", s.services()+"/"+id+"/resize", map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}, nil); code != 202 {
			t.Fatalf("resize: %d", code)
		}
		s.waitStatus(id, "READY", 60*time.Second)
		mustPoolerQuery(pw, 10*time.Second)
		ini, err := os.ReadFile(filepath.Join(s.dir, "runtime", "services", id, "pooler", "pgbouncer.ini"))
		if err != nil || !strings.Contains(string(ini), "default_pool_size = 35\n") {
			t.Errorf("after resize to max_connections 50, pgbouncer.ini (%v) lacks default_pool_size = 35", err)
		}
	})

	t.Run("UpdatePassword", func(t *testing.T) {
		const newPW = "pooled-new-password-42"
		if code := s.call("POST", s.services()+"/"+id+"/updatePassword", map[string]string{"password": newPW}, nil); code != 204 {
			t.Fatalf("updatePassword: %d", code)
		}
		c, err := pgx.Connect(ctx, s.poolerDSN(addr, newPW))
		if err != nil {
			t.Fatalf("new password through the pooler: %v", err)
		}
		var one int
		if err := c.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			t.Errorf("query with the new password: %v", err)
		}
		c.Close(ctx)
		_, err = pgx.Connect(ctx, s.poolerDSN(addr, pw))
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) {
			t.Errorf("old password through the pooler: %v, want a login failure", err)
		}
		pw = newPW
	})

	t.Run("Disable", func(t *testing.T) {
		if code := s.call("POST", s.services()+"/"+id+"/disablePooler", nil, nil); code != 200 {
			t.Fatalf("disablePooler: %d", code)
		}
		// The endpoint goes from GET at once; PgBouncer stops when the
		// engine has applied the change.
		s.waitPooler(id, false, 30*time.Second)
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				break
			}
			c.Close()
			if time.Now().After(deadline) {
				t.Fatalf("pooler port %s still accepts 30 s after disablePooler", addr)
			}
			time.Sleep(20 * time.Millisecond)
		}
		s.waitStatus(id, "READY", 30*time.Second)
		var one int
		if err := s.mustConnect(svc, pw).QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			t.Errorf("direct connection after disablePooler: %v", err)
		}
	})

	t.Run("ReenableKeepsPort", func(t *testing.T) {
		// The disable may still be finishing (409 OPERATION_IN_PROGRESS):
		// retry as a client would.
		deadline := time.Now().Add(30 * time.Second)
		for {
			code := s.call("POST", s.services()+"/"+id+"/enablePooler", nil, nil)
			if code == 200 {
				break
			}
			if code != 409 || time.Now().After(deadline) {
				t.Fatalf("enablePooler: %d", code)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got := s.waitPooler(id, true, 30*time.Second); got != addr {
			t.Errorf("pooler endpoint %s after re-enabling, was %s", got, addr)
		}
		mustPoolerQuery(pw, 5*time.Second)
	})
}
