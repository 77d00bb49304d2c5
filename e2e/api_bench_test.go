package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/internal/loadgen"
	"dbcloud/sqlite"
	"dbcloud/storetest"
)

// apiBlackBoxClients is the number of keep-alive HTTP/1.1 clients of
// BenchmarkAPIBlackBox, each sending its next request when the last one
// answered.
const apiBlackBoxClients = 16

// BenchmarkAPIBlackBox measures the API as users reach it: the real
// `dbcloud serve` binary (SQLite store, request log to a file, rate limit
// lifted), driven over loopback HTTPS from this process, beside a minimal
// Go HTTPS server in a process of its own that answers every request with
// a copy of our answer (same bytes), in the same run: GET service and list
// services with 1,000 services in the project, 16 keep-alive HTTP/1.1
// clients in a closed loop, 5 rounds of 3 s in which the servers take
// turns (the order alternates), req/s the median of the rounds and
// latencies over all rounds. With API_BLACKBOX_BASE naming another build
// of the binary (an older commit), that build serves too, in the same
// rounds. The services are seeded straight into the store (PAUSED, so the
// engine leaves them alone). -short: 100 services, 2 rounds of 0.3 s.
//
//	go test -run '^$' -bench '^BenchmarkAPIBlackBox$' -benchtime 1x -timeout 30m ./e2e/
func BenchmarkAPIBlackBox(b *testing.B) {
	n, rounds, round := 1000, 5, 3*time.Second
	if testing.Short() {
		n, rounds, round = 100, 2, 300*time.Millisecond
	}
	servers := []*apiServer{{name: "ours", s: newServer(b, "--pool-size", "0")}}
	if bin := os.Getenv("API_BLACKBOX_BASE"); bin != "" {
		s := newServer(b, "--pool-size", "0")
		s.stop()
		s.bin = bin
		s.start()
		servers = append(servers, &apiServer{name: "base", s: s})
	}
	for _, srv := range servers {
		srv.serviceID = seedPausedServices(b, srv.s, n)
	}
	for _, kind := range []string{"get", "list"} {
		b.Run(fmt.Sprintf("%s/services=%d", kind, n), func(b *testing.B) {
			for b.Loop() {
				compareBlackBox(b, servers, kind, rounds, round)
			}
		})
	}
}

// apiServer is one dbcloud serve under BenchmarkAPIBlackBox.
type apiServer struct {
	name      string
	s         *server
	serviceID string
}

func (a *apiServer) path(kind string) string {
	if kind == "get" {
		return a.s.services() + "/" + a.serviceID
	}
	return a.s.services()
}

// seedPausedServices inserts n services into s's store, beside the
// running server (as `dbcloud admin` writes to it), and returns one's ID:
// creating them through the API would take an instance each. PAUSED and
// not running, they are nothing the engine acts on.
func seedPausedServices(b *testing.B, s *server, n int) string {
	b.Helper()
	st, err := sqlite.Open(b.Context(), filepath.Join(s.dir, "dbcloud.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var first string
	for have := 0; have < n; {
		err := st.Update(b.Context(), func(tx dbcloud.Tx) error {
			for range min(1000, n-have) {
				svc := storetest.NewService(s.boot.ProjectID, dbcloud.NewID(), created.Add(time.Duration(have)*time.Millisecond))
				svc.Name = fmt.Sprintf("svc-%d", have)
				svc.Spec.Running, svc.Spec.VPCID, svc.Fork = false, "", nil
				svc.Status, svc.StatusReason, svc.ObservedGeneration = dbcloud.StatusPaused, "", svc.Generation
				svc.Endpoint.Port, svc.PoolerEndpoint.Port = 20000+2*have, 20001+2*have
				svc.Metrics = &dbcloud.Metrics{MilliCPU: 12, MemoryMB: 41, StorageMB: 38, Measured: created}
				if err := tx.InsertService(svc); err != nil {
					return err
				}
				if first == "" {
					first = svc.ID
				}
				have++
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return first
}

// blackBoxTarget is one server in compareBlackBox's rounds.
type blackBoxTarget struct {
	name, url string
	client    *http.Client
	auth      func(*http.Request)
	rec       *loadgen.Recorder
	rates     []float64
}

// compareBlackBox measures every server and a minimal one answering ours'
// body for kind, in alternating rounds, and reports them.
func compareBlackBox(b *testing.B, servers []*apiServer, kind string, rounds int, round time.Duration) {
	var targets []*blackBoxTarget
	for _, srv := range servers {
		targets = append(targets, &blackBoxTarget{
			name: srv.name, url: srv.s.baseURL + srv.path(kind), client: loadgen.NewClient(serverTLS(b, srv.s), apiBlackBoxClients),
			auth: func(r *http.Request) { r.SetBasicAuth(srv.s.boot.AccessKey, srv.s.boot.SecretKey) }, rec: loadgen.NewRecorder(),
		})
	}
	probe, _ := http.NewRequest("GET", targets[0].url, nil)
	targets[0].auth(probe)
	status, body, err := loadgen.Do(b.Context(), loadgen.NewRecorder(), targets[0].client, "probe", probe)
	if err != nil || status != 200 {
		b.Fatalf("GET %s: %d %v", targets[0].url, status, err)
	}
	minimalURL := startMinimalServer(b, body)
	targets = append(targets, &blackBoxTarget{
		name: "minimal", url: minimalURL + "/public/api/v1" + servers[0].path(kind),
		// Its certificate is httptest's; verifying it would only cost the
		// handshakes, which the warm-up does.
		client: loadgen.NewClient(&tls.Config{InsecureSkipVerify: true}, apiBlackBoxClients),
		auth:   func(*http.Request) {}, rec: loadgen.NewRecorder(),
	})
	drive := func(t *blackBoxTarget, rec *loadgen.Recorder, d time.Duration) time.Duration {
		return loadgen.Run(b.Context(), apiBlackBoxClients, d, func(ctx context.Context, _ int) {
			req, _ := http.NewRequest("GET", t.url, nil)
			t.auth(req)
			loadgen.Do(ctx, rec, t.client, kind, req)
		})
	}
	// Warm-up: every keep-alive connection open (its TLS handshake done)
	// before anything counts, however slow a busy machine makes that.
	for _, t := range targets {
		var wg sync.WaitGroup
		for range apiBlackBoxClients {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", t.url, nil)
				t.auth(req)
				loadgen.Do(b.Context(), loadgen.NewRecorder(), t.client, kind, req)
			})
		}
		wg.Wait()
		drive(t, loadgen.NewRecorder(), round/5)
	}
	for r := range rounds {
		order := slices.Clone(targets)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, t := range order {
			rec := loadgen.NewRecorder()
			took := drive(t, rec, round)
			stats := rec.Stats()
			if len(stats) == 0 {
				b.Fatalf("%s %s: no answer in a round of %v", t.name, kind, round)
			}
			s := stats[0]
			if s.Errors > 0 || s.Status[200] != s.Count {
				b.Fatalf("%s %s: statuses %v, %d errors (%s)", t.name, kind, s.Status, s.Errors, s.LastError)
			}
			t.rates = append(t.rates, float64(s.Count)/took.Seconds())
			for _, d := range rec.Latencies(kind) {
				t.rec.Add(kind, 200, d, nil)
			}
		}
	}
	minRate := medianOf(targets[len(targets)-1].rates)
	for _, t := range targets {
		prefix := t.name + "-"
		if t.name == "ours" {
			prefix = ""
		}
		st := t.rec.Stats()[0]
		b.ReportMetric(medianOf(t.rates), prefix+"req/s")
		b.ReportMetric(loadgen.Ms(st.P50), prefix+"p50-ms")
		b.ReportMetric(loadgen.Ms(st.P99), prefix+"p99-ms")
		if t.name != "minimal" {
			b.ReportMetric(medianOf(t.rates)/minRate, t.name+"/min")
		}
		b.Logf("%s: req/s by round %.0f", t.name, t.rates)
	}
	b.ReportMetric(map[string]float64{"get": 0.5, "list": 0.4}[kind], "goal-ours/min")
	b.ReportMetric(float64(len(body)), "body-bytes")
	b.ReportMetric(apiBlackBoxClients, "clients")
	b.ReportMetric(0, "ns/op")
}

// minimalBodyEnv names the file whose bytes the minimal server answers
// with: set, the test binary is that server (TestMain).
const minimalBodyEnv = "DBCLOUD_BENCH_MINIMAL_BODY"

// startMinimalServer runs the minimal HTTPS server answering body in a
// process of its own, as dbcloud serve runs in one, so that neither
// shares the load generator's process (on a busy machine the scheduler
// gives each process its share), and returns its URL. It is stopped by
// its PID when b ends.
func startMinimalServer(b *testing.B, body []byte) string {
	b.Helper()
	f := filepath.Join(b.TempDir(), "body.json")
	if err := os.WriteFile(f, body, 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), minimalBodyEnv+"="+f)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	url, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatalf("minimal server: %v", err)
	}
	return strings.TrimSpace(url)
}

// serveMinimal is the minimal server's process: HTTP/1.1 over TLS on a
// loopback port, every answer the same bytes. It prints its URL and
// serves until killed.
func serveMinimal(bodyFile string) {
	body, err := os.ReadFile(bodyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	srv.StartTLS()
	fmt.Println(srv.URL)
	select {}
}

// serverTLS trusts s's CA, as the CLI does.
func serverTLS(b *testing.B, s *server) *tls.Config {
	pem, err := os.ReadFile(s.boot.CAFile)
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool}
}
