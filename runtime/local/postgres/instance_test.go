package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
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
	"dbcloud/tlsca"
)

// mustInstances returns Instances over base/pool. It fails, not skips, when
// PostgreSQL is missing: CI must not pass by not running these tests.
func mustInstances(tb testing.TB, base string, poolSize int) *Instances {
	tb.Helper()
	logger := localtest.Logger(tb)
	m, err := NewInstances(Config{BinDir: pgbin.Dir(), PoolDir: filepath.Join(base, "pool"), PoolSize: poolSize, Logger: logger})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}

// mustSpec returns a spec for instance base/<id> with a certificate from a
// test CA and a free loopback port.
func mustSpec(tb testing.TB, base, id string) Spec {
	tb.Helper()
	ca, err := tlsca.LoadOrCreateCA(filepath.Join(base, "ca"))
	if err != nil {
		tb.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueServerCert(id, []string{"127.0.0.1", "localhost"}, 24*time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	return Spec{
		ID:         fmt.Sprintf("test-%d-%s", os.Getpid(), id),
		Dir:        filepath.Join(base, id),
		ListenAddr: "127.0.0.1",
		Port:       localtest.FreePort(tb),
		Settings:   map[string]string{"shared_buffers": "32MB", "max_connections": "20"},
		CertPEM:    certPEM,
		KeyPEM:     keyPEM,
	}
}

// mustCreate prepares and starts s, retrying on another port if a parallel
// test took the free one first, and destroys it when the test ends.
func mustCreate(tb testing.TB, m *Instances, s *Spec) int {
	tb.Helper()
	ctx := context.Background()
	tb.Cleanup(func() {
		if err := m.Destroy(context.Background(), *s); err != nil {
			tb.Errorf("destroy: %v", err)
		}
	})
	for attempt := 1; ; attempt++ {
		if err := m.Prepare(ctx, *s); err != nil {
			tb.Fatal(err)
		}
		pid, err := m.Start(ctx, *s)
		if err == nil {
			return pid
		}
		if attempt == 3 || !strings.Contains(err.Error(), "could not bind") {
			tb.Fatal(err)
		}
		s.Port = localtest.FreePort(tb)
	}
}

// setPassword sets tsdbadmin's password the way the control plane does:
// a SCRAM verifier computed here, so the plaintext never reaches the server.
func setPassword(ctx context.Context, m *Instances, s Spec, password string) error {
	verifier := dbcloud.NewSCRAMVerifier(password)
	return m.Exec(ctx, s, "postgres", "ALTER ROLE tsdbadmin PASSWORD '"+strings.ReplaceAll(verifier, "'", "''")+"'")
}

func tcpDSN(s Spec, password, sslmode string) string {
	return fmt.Sprintf("postgres://tsdbadmin:%s@127.0.0.1:%d/tsdb?sslmode=%s&connect_timeout=5", password, s.Port, sslmode)
}

func queryInt(tb testing.TB, m *Instances, s Spec, db, sql string) int {
	tb.Helper()
	ctx := context.Background()
	conn, err := m.Connect(ctx, s, db)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return n
}

func queryString(tb testing.TB, m *Instances, s Spec, sql string) string {
	tb.Helper()
	ctx := context.Background()
	conn, err := m.Connect(ctx, s, "postgres")
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return v
}

func readTrimmed(tb testing.TB, path string) string {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// TestManager_Lifecycle drives one real instance through its life; the
// steps share it because each start costs an initdb-sized wait otherwise.
func TestManager_Lifecycle(t *testing.T) {
	ctx := context.Background()
	base := localtest.Base(t)
	m := mustInstances(t, base, 0)
	s := mustSpec(t, base, "life")

	begin := time.Now()
	pid := mustCreate(t, m, &s)
	t.Logf("inline prepare + start: %v (pid %d)", time.Since(begin), pid)
	// Where the runtime enforces limits, the instance must have its group;
	// only a host where it says it cannot are the cgroup checks skipped.
	enforced, why := m.LimitsEnforced()
	cg := m.cgroups.Existing(s.ID)
	switch {
	case enforced && cg == nil:
		t.Fatalf("limits are enforced on this host (cgroup v%d), but instance %s has no group", m.cgroups.Version(), s.ID)
	case !enforced:
		t.Logf("limits are not enforced on this host (%v): cgroup checks are skipped", why)
	}

	t.Run("TLSLogin", func(t *testing.T) {
		const password = "correct-horse-battery"
		if err := setPassword(ctx, m, s, password); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, tcpDSN(s, password, "require"))
		if err != nil {
			t.Fatalf("TLS login as tsdbadmin: %v", err)
		}
		defer conn.Close(ctx)
		var ssl bool
		var user, db string
		if err := conn.QueryRow(ctx, "SELECT ssl, current_user, current_database() FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl, &user, &db); err != nil {
			t.Fatal(err)
		}
		if !ssl || user != "tsdbadmin" || db != "tsdb" {
			t.Errorf("got ssl=%v user=%s db=%s, want true tsdbadmin tsdb", ssl, user, db)
		}

		_, err = pgx.Connect(ctx, tcpDSN(s, password, "disable"))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28000" {
			t.Errorf("non-TLS login: got %v, want SQLSTATE 28000 (pg_hba.conf rejects)", err)
		}
		_, err = pgx.Connect(ctx, tcpDSN(s, "wrong-password", "require"))
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Errorf("wrong password: got %v, want SQLSTATE 28P01", err)
		}
	})

	t.Run("StartAdopts", func(t *testing.T) {
		again, err := m.Start(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if again != pid {
			t.Errorf("second Start: got pid %d, want the running %d", again, pid)
		}
		// A fresh Manager (a restarted dbcloud) adopts it too.
		other := mustInstances(t, base, 0)
		if got, err := other.Start(ctx, s); err != nil || got != pid {
			t.Errorf("Start from a new Manager: got %d, %v; want %d", got, err, pid)
		}
		for _, p := range serverProcesses(s.PGData()) {
			_, ppid, err := proc.State(p)
			if err != nil {
				// Gone since the listing (ENOENT, or ESRCH mid-read): a
				// backend of a login refused above, ending.
				continue
			}
			if p != pid && ppid != pid {
				t.Errorf("process %d (parent %d) is not the postmaster %d nor its child: a second postmaster?", p, ppid, pid)
			}
		}
	})

	t.Run("InCgroup", func(t *testing.T) {
		if !enforced {
			t.Skipf("limits not enforced on this host: %v", why)
		}
		procs, err := cg.Procs()
		if err != nil {
			t.Fatal(err)
		}
		server := serverProcesses(s.PGData())
		if len(server) < 5 {
			t.Errorf("only %d server processes: %v", len(server), server)
		}
		for _, p := range server {
			if !slices.Contains(procs, p) {
				t.Errorf("server process %d not in cgroup (members %v)", p, procs)
			}
		}
	})

	t.Run("StopStartKeepsData", func(t *testing.T) {
		if err := m.Exec(ctx, s, "tsdb", "CREATE TABLE public.kept (x int); INSERT INTO public.kept VALUES (42)"); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		if err := m.Stop(ctx, s, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("stop: %v", time.Since(begin))
		if _, ok := m.Running(s); ok {
			t.Fatal("Running after Stop")
		}
		if err := m.Stop(ctx, s, 10*time.Second); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
		begin = time.Now()
		newPID, err := m.Start(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("start: %v", time.Since(begin))
		pid = newPID
		if got := queryInt(t, m, s, "tsdb", "SELECT x FROM public.kept"); got != 42 {
			t.Errorf("after restart: got %d, want 42", got)
		}
	})

	t.Run("SIGKILL", func(t *testing.T) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		for deadline := begin.Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			if _, ok := m.Running(s); !ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("Running still true 30 s after SIGKILL")
			}
		}
		t.Logf("Running false %v after SIGKILL; server processes still alive then: %d",
			time.Since(begin), len(serverProcesses(s.PGData())))
		begin = time.Now()
		newPID, err := m.Start(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("start after SIGKILL (incl. crash recovery): %v", time.Since(begin))
		if newPID == pid {
			t.Errorf("Start after SIGKILL returned the dead pid %d", pid)
		}
		if cg != nil {
			procs, err := cg.Procs()
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range procs {
				if _, ppid, _ := proc.State(p); p != newPID && ppid != newPID {
					t.Errorf("cgroup member %d (parent %d) is not of the new postmaster %d", p, ppid, newPID)
				}
			}
		}
		pid = newPID
		if got := queryInt(t, m, s, "tsdb", "SELECT x FROM public.kept"); got != 42 {
			t.Errorf("after crash: got %d, want 42", got)
		}
	})

	t.Run("SetLimits", func(t *testing.T) {
		s.CPUMillis, s.MemoryBytes = 500, 512<<20
		if err := m.SetLimits(s); err != nil {
			t.Fatal(err)
		}
		if !enforced {
			t.Skipf("limits not enforced on this host: %v", why)
		}
		want := map[string]string{
			filepath.Join(cg.Dir("cpu"), "cpu.cfs_period_us"):        "100000",
			filepath.Join(cg.Dir("cpu"), "cpu.cfs_quota_us"):         "50000",
			filepath.Join(cg.Dir("memory"), "memory.limit_in_bytes"): strconv.Itoa(512 << 20),
		}
		unlimited := map[string]string{filepath.Join(cg.Dir("cpu"), "cpu.cfs_quota_us"): "-1"}
		if m.cgroups.Version() == 2 {
			want = map[string]string{
				filepath.Join(cg.Dir("cpu"), "cpu.max"):       "50000 100000",
				filepath.Join(cg.Dir("memory"), "memory.max"): strconv.Itoa(512 << 20),
			}
			unlimited = map[string]string{filepath.Join(cg.Dir("cpu"), "cpu.max"): "max 100000"}
		}
		for file, want := range want {
			if got := readTrimmed(t, file); got != want {
				t.Errorf("%s: got %s, want %s", file, got, want)
			}
		}
		s.CPUMillis, s.MemoryBytes = 0, 0
		if err := m.SetLimits(s); err != nil {
			t.Fatal(err)
		}
		for file, want := range unlimited {
			if got := readTrimmed(t, file); got != want {
				t.Errorf("unlimited: %s = %s, want %s", file, got, want)
			}
		}
	})

	t.Run("Reload", func(t *testing.T) {
		s.Settings["work_mem"] = "8MB"
		s.Settings["dbcloud.note"] = `it's a\test`
		restart, err := m.Reload(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if restart {
			t.Error("work_mem change: restart needed, want reload only")
		}
		if got := queryInt(t, m, s, "postgres", "SELECT setting::int FROM pg_settings WHERE name = 'work_mem'"); got != 8192 {
			t.Errorf("work_mem after reload: got %d kB, want 8192", got)
		}
		if got := queryString(t, m, s, "SELECT current_setting('dbcloud.note')"); got != `it's a\test` {
			t.Errorf("quoted setting after reload: got %q", got)
		}
		s.Settings["shared_buffers"] = "64MB"
		if restart, err = m.Reload(ctx, s); err != nil {
			t.Fatal(err)
		} else if !restart {
			t.Error("shared_buffers change: no restart needed, want restart")
		}
		if err := m.Stop(ctx, s, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if pid, err = m.Start(ctx, s); err != nil {
			t.Fatal(err)
		}
		if got := queryInt(t, m, s, "postgres", "SELECT setting::int FROM pg_settings WHERE name = 'shared_buffers'"); got != 64*128 {
			t.Errorf("shared_buffers after restart: got %d pages, want %d", got, 64*128)
		}
		if restart, err = m.Reload(ctx, s); err != nil || restart {
			t.Errorf("unchanged reload after restart: got %v, %v; want false, nil", restart, err)
		}
	})

	t.Run("StartFailure", func(t *testing.T) {
		if err := m.Stop(ctx, s, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		good := s.Port
		s.Port = busy.Addr().(*net.TCPAddr).Port
		if err := m.Prepare(ctx, s); err != nil {
			t.Fatal(err)
		}
		_, err = m.Start(ctx, s)
		if err == nil || !strings.Contains(err.Error(), "could not bind") {
			t.Errorf("Start on a busy port: got %v, want an error quoting the bind failure", err)
		}
		if _, ok := m.Running(s); ok {
			t.Error("Running after a failed start")
		}
		if left := serverProcesses(s.PGData()); len(left) > 0 {
			t.Errorf("processes left after a failed start: %v", left)
		}
		s.Port = good
		if err := m.Prepare(ctx, s); err != nil {
			t.Fatal(err)
		}
		if pid, err = m.Start(ctx, s); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Usage", func(t *testing.T) {
		u, err := m.Usage(s)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("usage: %+v", u)
		if u.StorageBytes < 10<<20 {
			t.Errorf("storage: got %d bytes, want a cluster's worth", u.StorageBytes)
		}
		if cg != nil && (u.MemoryBytes <= 0 || u.CPUNanos == 0) {
			t.Errorf("memory %d, cpu %d: want both > 0", u.MemoryBytes, u.CPUNanos)
		}
	})

	t.Run("Destroy", func(t *testing.T) {
		if err := m.Destroy(ctx, s); err != nil {
			t.Fatal(err)
		}
		if proc.Alive(pid) {
			t.Errorf("postmaster %d alive after Destroy", pid)
		}
		if left := serverProcesses(s.PGData()); len(left) > 0 {
			t.Errorf("processes left: %v", left)
		}
		if _, err := os.Stat(s.Dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("dir after Destroy: %v", err)
		}
		if cg != nil && cg.Exists() {
			t.Error("cgroup left after Destroy")
		}
		if err := m.Destroy(ctx, s); err != nil {
			t.Errorf("second Destroy: %v", err)
		}
	})
}

// systemIdentifier reads the first 8 bytes of global/pg_control.
func systemIdentifier(tb testing.TB, pgdata string) uint64 {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(pgdata, "global", "pg_control"))
	if err != nil || len(data) < 8 {
		tb.Fatalf("read pg_control: %v", err)
	}
	return binary.LittleEndian.Uint64(data)
}

func TestManager_Pool(t *testing.T) {
	ctx := context.Background()
	base := localtest.Base(t)
	m := mustInstances(t, base, 2)

	// Leftovers of a crash: a half-made entry and a taken one.
	for _, dir := range []string{".tmp-dead/pgdata", "ready-taken"} {
		if err := os.MkdirAll(filepath.Join(m.PoolDir, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	begin := time.Now()
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{".tmp-dead", "ready-taken"} {
		if _, err := os.Stat(filepath.Join(m.PoolDir, dir)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale pool entry %s survived Open: %v", dir, err)
		}
	}
	var ready []string
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ready = m.readyEntries(); len(ready) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d ready entries after 40s, want 2", len(ready))
		}
	}
	t.Logf("pool filled with 2 clusters in %v", time.Since(begin))
	a := systemIdentifier(t, filepath.Join(m.PoolDir, ready[0], "pgdata"))
	b := systemIdentifier(t, filepath.Join(m.PoolDir, ready[1], "pgdata"))
	if a == b {
		t.Errorf("pool clusters share system identifier %d", a)
	}

	s := mustSpec(t, base, "pooled")
	begin = time.Now()
	if err := m.Prepare(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Logf("Prepare from pool: %v", time.Since(begin))
	if got := systemIdentifier(t, s.PGData()); got != a {
		t.Errorf("instance system identifier %d, want the first pool entry's %d", got, a)
	}
	if _, err := os.Stat(filepath.Join(m.PoolDir, ready[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("taken entry %s still in the pool: %v", ready[0], err)
	}
	// Prepare is idempotent: the data directory stays.
	if err := m.Prepare(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got := systemIdentifier(t, s.PGData()); got != a {
		t.Errorf("second Prepare replaced the data directory")
	}
	mustCreate(t, m, &s)
	if n := queryInt(t, m, s, "tsdb", "SELECT count(*) FROM pg_roles WHERE rolname = 'tsdbadmin' AND rolcanlogin AND rolcreatedb AND rolcreaterole AND NOT rolsuper"); n != 1 {
		t.Errorf("tsdbadmin role: got %d matching, want 1", n)
	}

	// Close abandons a refill in progress and leaves no half-made entry
	// and no preparation server behind. The take woke the loop: Close comes
	// once its preparation has begun (a .tmp- entry exists).
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		entries, _ := os.ReadDir(m.PoolDir)
		if slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), poolTmpPrefix) }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no pool refill began within 60 s of a take")
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(m.PoolDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), poolTmpPrefix) {
			t.Errorf("half-made entry %s left after Close", e.Name())
		}
		if procs := serverProcesses(filepath.Join(m.PoolDir, e.Name(), "pgdata")); len(procs) > 0 {
			t.Errorf("pool entry %s has running processes %v after Close", e.Name(), procs)
		}
	}
}

// BenchmarkCreateFromPool measures the hot path of creating a service with
// a warm pool: take a prepared cluster, write the config, start, set the
// password, and log in over TLS as the application would. Refilling the
// pool is outside the timer.
func BenchmarkCreateFromPool(b *testing.B) {
	ctx := context.Background()
	base := localtest.Base(b)
	m := mustInstances(b, base, 0)
	if err := os.MkdirAll(m.PoolDir, 0o755); err != nil {
		b.Fatal(err)
	}
	var prepareTotal, startTotal, loginTotal time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := m.addToPool(ctx, 0); err != nil {
			b.Fatal(err)
		}
		s := mustSpec(b, base, fmt.Sprintf("bench%d", i))
		b.StartTimer()

		begin := time.Now()
		if err := m.Prepare(ctx, s); err != nil {
			b.Fatal(err)
		}
		prepareTotal += time.Since(begin)
		begin = time.Now()
		if _, err := m.Start(ctx, s); err != nil {
			b.Fatal(err)
		}
		startTotal += time.Since(begin)
		begin = time.Now()
		if err := setPassword(ctx, m, s, "bench-password-1"); err != nil {
			b.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, tcpDSN(s, "bench-password-1", "require"))
		if err != nil {
			b.Fatal(err)
		}
		if err := conn.Ping(ctx); err != nil {
			b.Fatal(err)
		}
		conn.Close(ctx)
		loginTotal += time.Since(begin)

		b.StopTimer()
		if err := m.Destroy(ctx, s); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/op")
	b.ReportMetric(0, "ns/op")
	perOp := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(perOp(prepareTotal), "prepare-ms/op")
	b.ReportMetric(perOp(startTotal), "start-ms/op")
	b.ReportMetric(perOp(loginTotal), "password+login-ms/op")
}
