package e2e

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/internal/pgbin"
	"dbcloud/internal/testports"
	"dbcloud/runtime/local/postgres"
	"dbcloud/sizing"
	"dbcloud/tlsca"
)

// readyPool counts the prepared clusters waiting in the server's pool
// for the version creates get, the newest installed: its main pool
// ("pool") when its binaries (pgbin.Dir) are that version, else
// pool-<major>, whose size is the configured one (the main pool of an
// older version keeps at most one).
func (s *server) readyPool(b testing.TB) int {
	newest, _ := newestInstalled()
	dir := "pool"
	if main, _, err := pgbin.Version(pgbin.Dir()); err != nil {
		b.Fatal(err)
	} else if main != newest {
		dir += "-" + strconv.Itoa(newest)
	}
	n, _ := filepath.Glob(filepath.Join(s.dir, "runtime", dir, "ready-*"))
	return len(n)
}

// newestInstalled is the newest PostgreSQL major version installed, the
// one new services get, and its binaries' directory.
func newestInstalled() (int, string) {
	installed := pgbin.Installed("")
	newest := slices.Max(slices.Collect(maps.Keys(installed)))
	return newest, installed[newest]
}

// waitPool waits until the server's pool holds want prepared clusters,
// or until it stops filling: no cluster added for poolStalled (a pool
// that cannot fill, which the run's log then says).
func (s *server) waitPool(b testing.TB, want int) {
	const poolStalled = 30 * time.Second
	had, grew := -1, time.Now()
	for {
		n := s.readyPool(b)
		if n >= want {
			return
		}
		if n > had {
			had, grew = n, time.Now()
		}
		if time.Since(grew) > poolStalled {
			b.Logf("the pool holds %d prepared clusters of %d and stopped filling; measuring as it is", n, want)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// benchCreates creates n shared services one after another and returns,
// per create, the service ID, when its POST was sent and the time from the
// POST to the first GET that shows READY. With a floor pool, a floor take
// (see floorPool) comes beside each create, before or after it in turn,
// so that both see the same load from the rest of the machine.
func benchCreates(b *testing.B, s *server, n int, floor *floorPool) (creates []createTiming, floors []time.Duration) {
	for i := range n {
		if floor != nil && i%2 == 1 {
			floors = append(floors, floor.take(b, len(floors)))
		}
		start := time.Now()
		created := s.create(map[string]any{"name": "bench-" + strconv.Itoa(i), "cpu_millis": "shared"})
		for {
			svc, _ := s.get(created.ServiceID)
			if svc.Status == "READY" {
				break
			}
			if svc.Status == "UNSTABLE" || time.Since(start) > time.Minute {
				b.Fatalf("create %d: %s %s", i, svc.Status, svc.StatusReason)
			}
			time.Sleep(createPoll)
		}
		creates = append(creates, createTiming{id: created.ServiceID, start: start, took: time.Since(start)})
		if floor != nil && i%2 == 0 {
			floors = append(floors, floor.take(b, len(floors)))
		}
	}
	return creates, floors
}

// createPoll is how often benchCreates asks for a service's status: as a
// client polling from outside would (curl every 5 ms).
const createPoll = 5 * time.Millisecond

// benchCLICreates creates n shared services one after another with the
// original's CLI, as a user would (`tiger service create`, which waits for
// READY by default), and returns the wall time of each command.
func benchCLICreates(b *testing.B, tiger func(args ...string) *exec.Cmd, n int) []time.Duration {
	var took []time.Duration
	for i := range n {
		start := time.Now()
		out, err := tiger("service", "create", "--name", "bench-cli-"+strconv.Itoa(i), "--cpu", "shared", "--memory", "shared",
			"--no-set-default", "--wait-timeout", "1m").CombinedOutput()
		if err != nil {
			b.Fatalf("tiger service create %d: %v\n%s", i, err, out)
		}
		took = append(took, time.Since(start))
	}
	return took
}

// tigerCLI returns a command runner for the original's CLI
// (DBCLOUD_TIGER_BIN) logged in to s with its API key, or skips b.
func tigerCLI(b *testing.B, s *server) func(args ...string) *exec.Cmd {
	bin := os.Getenv("DBCLOUD_TIGER_BIN")
	if bin == "" {
		b.Skip("DBCLOUD_TIGER_BIN is not set: no tiger binary to run (it is not on the module proxy)")
	}
	home := b.TempDir()
	env := append(os.Environ(), "HOME="+home, "TIGER_CONFIG_DIR="+filepath.Join(home, "tiger"),
		"TIGER_API_URL="+s.baseURL, "SSL_CERT_FILE="+s.boot.CAFile, "TIGER_ANALYTICS=false",
		"TIGER_VERSION_CHECK=false", "TIGER_PASSWORD_STORAGE=none",
		"TIGER_PUBLIC_KEY="+s.boot.AccessKey, "TIGER_SECRET_KEY="+s.boot.SecretKey)
	tiger := func(args ...string) *exec.Cmd {
		c := exec.Command(bin, args...)
		c.Env = env
		return c
	}
	if out, err := tiger("auth", "login").CombinedOutput(); err != nil {
		b.Fatalf("tiger auth login: %v\n%s", err, out)
	}
	return tiger
}

// createTiming is one create of benchCreates.
type createTiming struct {
	id    string
	start time.Time
	took  time.Duration
}

// BenchmarkCreateToReady measures create to READY over 20 creates, as the
// API shows it (POST, then GET every 2 ms), beside its floor measured in
// the same run. "pool" starts with a full pool of prepared clusters, the
// steady state; beside each of its creates comes a floor take: a prepared
// cluster taken from a pool of the test's own (the runtime's code, sizes
// and limits) from the rename of its data directory to the first TLS login
// with a password set just before, what no create can beat; that pool is
// on the server's filesystem and of the version creates get. "floor"
// reports those takes, and "pool" its p50 over theirs. "burst" has the
// default pool and creates back to back, so the pool must grow and refill
// ahead of the creates. "cli" has a full pool too and creates with the
// original's CLI (DBCLOUD_TIGER_BIN; skipped without it), whose wait for
// READY looks once a second: each create is the command's wall time. Each
// POST/GET row also logs the server's steps (its log lines, in ms from the
// POST) of its p50 and p95 creates. Statuses are polled every 5 ms, as
// from outside. -short makes 3 creates of each.
// Run: go test -v -run '^$' -bench '^BenchmarkCreateToReady$' -benchtime 1x -timeout 30m ./e2e/
func BenchmarkCreateToReady(b *testing.B) {
	creates := 20
	if testing.Short() {
		creates = 3
	}
	var floors []time.Duration
	var floorP50 time.Duration
	for _, tc := range []struct {
		name string
		pool int // 0: the default
		cli  bool
	}{{"pool", creates, false}, {"floor", -1, false}, {"burst", 0, false}, {"cli", creates, true}} {
		b.Run(tc.name, func(b *testing.B) {
			if tc.pool < 0 {
				for b.Loop() {
				}
				if len(floors) == 0 {
					b.Skip("no floor takes: the pool row did not run")
				}
				reportLatency(b, floors)
				return
			}
			// Enough room on a 2-core host for the creates' shared
			// services (500 millicores each).
			args := []string{"--quota-services", "50", "--overcommit", "16"}
			// DBCLOUD_BENCH_CREATE_ARGS adds server flags, e.g.
			// "--storage-image-gib 0" for the host's filesystem instead
			// of the default btrfs image.
			args = append(args, strings.Fields(os.Getenv("DBCLOUD_BENCH_CREATE_ARGS"))...)
			want := 2 // serve's default pool size
			if tc.pool > 0 {
				args, want = append(args, "--pool-size", strconv.Itoa(tc.pool)), tc.pool
			}
			s := newServer(b, args...)
			var floor *floorPool
			if tc.pool > 0 && !tc.cli {
				floor = newFloorPool(b, s, creates) // fills while the server's pool does
			}
			var tiger func(args ...string) *exec.Cmd
			if tc.cli {
				tiger = tigerCLI(b, s) // skips before any wait without the CLI
			}
			s.waitPool(b, want)
			floor.wait(b)
			if tc.cli {
				b.ResetTimer()
				var took []time.Duration
				for b.Loop() {
					took = append(took, benchCLICreates(b, tiger, creates)...)
				}
				b.StopTimer()
				reportLatency(b, took)
				return
			}
			b.ResetTimer()
			var timings []createTiming
			for b.Loop() {
				c, f := benchCreates(b, s, creates, floor)
				timings, floors = append(timings, c...), append(floors, f...)
			}
			b.StopTimer()
			took := make([]time.Duration, len(timings))
			for i, t := range timings {
				took[i] = t.took
			}
			reportLatency(b, took)
			// In order: whether the slow ones come when the pool refills
			// (in the pool row, once half of it is taken).
			inOrder := make([]string, len(took))
			for i, d := range took {
				inOrder[i] = strconv.FormatInt(d.Milliseconds(), 10)
			}
			b.Logf("creates in order, ms: %s", strings.Join(inOrder, " "))
			p50 := percentile(took, 0.5)
			b.ReportMetric(float64(percentile(took, 0.95))/float64(p50), "p95/p50")
			if len(floors) > 0 {
				floorP50 = percentile(floors, 0.5)
			}
			if floorP50 > 0 {
				b.ReportMetric(float64(p50)/float64(floorP50), "p50/floor")
			}
			if len(timings) > 0 {
				b.Logf("pool preparations during the row, ms (median / max):\n%s", s.preparations(timings[0].start))
			}
			// The step that waits for the filesystem's commits: the
			// password's ALTER ROLE on the new instance.
			if d := s.stepTimes(timings, "password_ms"); len(d) > 0 {
				b.ReportMetric(float64(percentile(d, 0.5).Microseconds())/1000, "password-p50-ms")
			}
			for _, p := range []float64{0.5, 0.95} {
				d := percentile(took, p)
				for _, t := range timings {
					if t.took == d {
						b.Logf("steps of the p%.0f create (%s, %v), ms from its POST:\n%s", p*100, t.id, d.Round(time.Millisecond), s.steps(t))
						break
					}
				}
			}
		})
	}
}

func reportLatency(b *testing.B, took []time.Duration) {
	b.ReportMetric(float64(percentile(took, 0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(took, 0.95).Microseconds())/1000, "p95-ms")
	b.ReportMetric(0, "ns/op")
}

// steps lists what the server logged about a create, other than requests,
// as "<ms since the POST> <message> <fields>" lines: where its time went.
func (s *server) steps(t createTiming) string {
	raw, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	var out strings.Builder
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, t.id) {
			continue
		}
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil || entry["msg"] == "request" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(entry["time"]))
		if err != nil || at.Before(t.start) || at.After(t.start.Add(t.took+time.Second)) {
			continue
		}
		msg := fmt.Sprint(entry["msg"])
		delete(entry, "time")
		delete(entry, "level")
		delete(entry, "msg")
		fields, _ := json.Marshal(entry)
		fmt.Fprintf(&out, "  %6.1f  %s %s\n", float64(at.Sub(t.start).Microseconds())/1000, msg, fields)
	}
	return out.String()
}

// stepTimes is how long the step (its field in "service ensured", e.g.
// "password_ms") took in each of the creates that logged it.
func (s *server) stepTimes(creates []createTiming, field string) []time.Duration {
	raw, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	ids := map[string]bool{}
	for _, c := range creates {
		ids[c.id] = true
	}
	var out []time.Duration
	for _, line := range strings.Split(string(raw), "\n") {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil || entry["msg"] != "service ensured" || !ids[fmt.Sprint(entry["service"])] {
			continue
		}
		if ms, ok := entry[field].(float64); ok {
			out = append(out, time.Duration(ms*float64(time.Millisecond)))
			delete(ids, fmt.Sprint(entry["service"])) // its first ensure: the create's
		}
	}
	return out
}

// preparations sums up the pool's preparations the server logged since
// since: how many, and the median and slowest of each step (the OS user of
// the entry, the copy of the template, pg_resetwal, syncfs, and the whole
// preparation). A create that finds the pool empty waits for one of them.
func (s *server) preparations(since time.Time) string {
	raw, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	steps := map[string][]time.Duration{}
	for _, line := range strings.Split(string(raw), "\n") {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(entry["time"]))
		if err != nil || at.Before(since) {
			continue
		}
		add := func(step, field string) {
			if ms, ok := entry[field].(float64); ok {
				steps[step] = append(steps[step], time.Duration(ms)*time.Millisecond)
			}
		}
		switch entry["msg"] {
		case "OS user created":
			if strings.Contains(fmt.Sprint(entry["user"]), "-p-") {
				add("os user", "ms")
			}
		case "pool cluster copied from the template":
			add("copy", "copy_ms")
			add("pg_resetwal", "resetwal_ms")
			add("syncfs", "sync_ms")
		case "pool cluster prepared":
			add("whole", "ms")
		}
	}
	var out strings.Builder
	for _, step := range []string{"os user", "copy", "pg_resetwal", "syncfs", "whole"} {
		if d := steps[step]; len(d) > 0 {
			fmt.Fprintf(&out, "  %-12s %3d  %5d / %5d\n", step, len(d), percentile(d, 0.5).Milliseconds(), slices.Max(d).Milliseconds())
		}
	}
	return out.String()
}

// floorPool is a pool of prepared clusters of the test's own, for floor
// takes: each is the part of a create that only a faster PostgreSQL could
// shorten. It is on the server's filesystem (its runtime directory: the
// btrfs image by default, the host's filesystem with
// --storage-image-gib 0) and of the version creates get (the newest
// installed), as the server's pool is: a floor on another filesystem or
// version would not be the floor of those creates.
type floorPool struct {
	m      *postgres.Instances
	n      int
	dir    string
	ca     *tlsca.CA
	caFile string
	specs  []postgres.Spec
}

// newFloorPool starts filling a pool of n prepared clusters beside s's
// (see floorPool). Its cleanup comes before s's, which unmounts the image.
func newFloorPool(b *testing.B, s *server, n int) *floorPool {
	// A short name: its clusters' socket paths must fit in 107 bytes.
	dir, err := os.MkdirTemp(s.runtimeDir(), "fl")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	_, binDir := newestInstalled()
	// Its failures are the run's: a floor pool that cannot fill says why.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := postgres.NewInstances(postgres.Config{BinDir: binDir, PoolDir: filepath.Join(dir, "pool"), PoolSize: n, Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	f := &floorPool{m: m, n: n, dir: dir}
	b.Cleanup(func() {
		m.Close()
		for _, s := range f.specs {
			if err := m.Destroy(ctx, s); err != nil {
				b.Error(err)
			}
		}
		os.RemoveAll(dir)
	})
	if err := m.Open(ctx); err != nil {
		b.Fatal(err)
	}
	if f.ca, err = tlsca.LoadOrCreateCA(filepath.Join(dir, "ca")); err != nil {
		b.Fatal(err)
	}
	f.caFile = filepath.Join(dir, "ca", "floor-ca.crt")
	if err := os.WriteFile(f.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.ca.Cert.Raw}), 0o644); err != nil {
		b.Fatal(err)
	}
	return f
}

// wait waits until the pool is full, then stops its refill: no
// preparation competes with the takes. A nil pool has nothing to wait for.
func (f *floorPool) wait(b *testing.B) {
	if f == nil {
		return
	}
	for deadline := time.Now().Add(3 * time.Minute); f.m.PoolReady() < f.n && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	f.m.Close()
}

// take takes the i-th prepared cluster and returns the time from the take
// to the first TLS login as tsdbadmin with a password set just before,
// with the sizes and limits of a shared service.
func (f *floorPool) take(b *testing.B, i int) time.Duration {
	ctx := context.Background()
	res := sizing.For(dbcloud.Size{Shared: true})
	certPEM, keyPEM, err := f.ca.IssueServerCert("floor", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	spec := postgres.Spec{
		ID: fmt.Sprintf("floor-%d-%d", os.Getpid(), i), Dir: filepath.Join(f.dir, strconv.Itoa(i)),
		ListenAddr: "127.0.0.1", Port: testports.MustPort(b), Settings: maps.Clone(res.Settings),
		CPUMillis: res.CPUMillis, MemoryBytes: res.MemoryBytes, CertPEM: certPEM, KeyPEM: keyPEM,
	}
	password := dbcloud.NewPassword()
	verifier := dbcloud.NewSCRAMVerifier(password)
	f.specs = append(f.specs, spec)
	start := time.Now()
	if err := f.m.Ensure(ctx, spec); err != nil {
		b.Fatal(err)
	}
	if err := f.m.Exec(ctx, spec, "postgres", "ALTER ROLE tsdbadmin PASSWORD "+postgres.QuoteLiteral(verifier)); err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=tsdbadmin dbname=tsdb password=%s sslmode=verify-full sslrootcert=%s",
		spec.Port, postgres.QuoteDSN(password), postgres.QuoteDSN(f.caFile)))
	if err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	conn.Close(ctx)
	return took
}

// BenchmarkIdleMemory reports the memory (cgroup working set) of idle shared
// services, as their metrics show it, and the host memory they take, over
// 10 services (2 with -short).
// Run: go test -run '^$' -bench IdleMemory -benchtime 1x ./e2e/
func BenchmarkIdleMemory(b *testing.B) {
	s := newServer(b, "--pool-size", "2")
	n := 10
	if testing.Short() {
		n = 2
	}
	for b.Loop() {
		before := memAvailable()
		ids := []string{}
		for i := range n {
			created := s.create(map[string]any{"name": "idle-" + strconv.Itoa(i), "cpu_millis": "shared"})
			ids = append(ids, created.ServiceID)
			s.waitStatus(created.ServiceID, "READY", time.Minute)
		}
		time.Sleep(12 * time.Second) // idle, and two metrics rounds
		var mems []float64
		for _, id := range ids {
			svc, _ := s.get(id)
			if svc.Metrics != nil {
				mems = append(mems, float64(svc.Metrics.MemoryMB))
			}
		}
		slices.Sort(mems)
		if len(mems) == 0 {
			b.Fatal("no metrics")
		}
		b.ReportMetric(mems[len(mems)/2], "median-MB/service")
		b.ReportMetric(float64(before-memAvailable())/float64(n)/(1<<20), "host-MB/service")
		b.ReportMetric(float64(n), "services")
		b.ReportMetric(0, "ns/op")
	}
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() int64 {
	raw, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkFailover measures failover of an HA service (two standbys, one
// synchronous) on the real binary: from the failure of the primary to the
// first write acknowledged by the new primary through the service
// endpoint, 5 times by SIGKILL and 5 times by removing the primary's data
// directory, alternating. Each run also checks that no acknowledged commit
// was lost and waits for the old primary to be rebuilt before the next.
// -short runs each case once.
//
//	go test -run '^$' -bench '^BenchmarkFailover$' -benchtime 1x -timeout 30m ./e2e/
func BenchmarkFailover(b *testing.B) {
	runs := 5
	if testing.Short() {
		runs = 1
	}
	for range b.N {
		s := newServer(b)
		svc, password := s.haService(b)
		var kill, removed []time.Duration
		var killed []failoverResult // each SIGKILL's
		for i := range 2 * runs {
			brk, into := killPrimary, &kill
			if i%2 == 1 {
				brk, into = removePrimaryData, &removed
			}
			r := s.failover(b, svc, password, (i+1)*1_000_000, brk)
			*into = append(*into, r.took)
			if i%2 == 0 {
				killed = append(killed, r)
			}
			b.Logf("run %d (%s): %v, %d acknowledged commits, none lost", i+1, map[bool]string{true: "SIGKILL", false: "data removed"}[i%2 == 0], r.took, r.acked)
		}
		// Where the time of the median SIGKILL went: the server's log
		// lines about the service, PostgreSQL's own, and the client's
		// login and write, in ms from the kill.
		p50 := percentile(kill, 0.5)
		for _, r := range killed {
			if r.took != p50 {
				continue
			}
			k := createTiming{id: svc.ServiceID, start: r.broken, took: r.took}
			ms := func(t time.Time) float64 { return float64(t.Sub(r.broken).Microseconds()) / 1000 }
			b.Logf("steps of the p50 SIGKILL failover (%v), ms from the kill:\n%s"+
				"PostgreSQL's log:\n%s"+
				"the client: login began %.1f, logged in %.1f, first write acknowledged %.1f",
				p50.Round(time.Millisecond), s.steps(k), s.serverLogOf(k), ms(r.first.login), ms(r.first.loggedIn), ms(r.first.at))
		}
		b.ReportMetric(p50.Seconds(), "p50-s")
		b.ReportMetric(percentile(kill, 0.95).Seconds(), "p95-s")
		b.ReportMetric(percentile(kill, 1).Seconds(), "max-s")
		b.ReportMetric(percentile(removed, 0.5).Seconds(), "removed-p50-s")
		b.ReportMetric(percentile(removed, 1).Seconds(), "removed-max-s")
		b.ReportMetric(float64(runs), "runs")
		b.ReportMetric(0, "ns/op")
	}
}
