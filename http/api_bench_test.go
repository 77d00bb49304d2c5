package http_test

import (
	"context"
	"fmt"
	"log/slog"
	stdhttp "net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/http"
	"dbcloud/internal/loadgen"
)

// apiClients is the number of keep-alive clients of BenchmarkAPI, each
// sending its next request as soon as the last one answered.
const apiClients = 16

// BenchmarkAPI drives GET service and list services over HTTPS on loopback
// with 1,000 and then 10,000 services in the SQLite store, beside a minimal
// Go HTTPS server that answers every request with a fixed body of the same
// bytes (copied from our answer), in the same process and run. The two
// alternate, round by round, so load from other processes falls on both;
// the report is our throughput and latency, the minimal server's, and the
// ratio. Both servers are httptest TLS servers (HTTP/1.1, same
// certificate); ours logs every request as JSON to a file, as dbcloud
// serve does. The load generator runs in the same process, on the same
// cores. -short uses 100 services and short rounds.
//
//	go test -run '^$' -bench '^BenchmarkAPI$' -benchtime 1x -timeout 30m ./http/
func BenchmarkAPI(b *testing.B) {
	sizes, rounds, round := []int{1000, 10000}, 5, 3*time.Second
	if testing.Short() {
		sizes, rounds, round = []int{100}, 2, 300*time.Millisecond
	}
	e := newEnv(b, "sqlite", noLimits)
	logFile, err := os.Create(filepath.Join(b.TempDir(), "requests.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	ours := httptest.NewUnstartedServer(http.NewHandler(e.cloud, noLimits, slog.New(slog.NewJSONHandler(logFile, nil))))
	ours.StartTLS()
	defer ours.Close()
	tmpl := seedTemplate(b, e)
	for _, n := range sizes {
		seedServices(b, e, tmpl, n)
		for _, c := range []struct{ name, path string }{
			{"get", e.pa() + "/services/" + tmpl.ID},
			{"list", e.pa() + "/services"},
		} {
			b.Run(fmt.Sprintf("%s/services=%d", c.name, n), func(b *testing.B) {
				for b.Loop() {
					compareWithMinimal(b, e, ours, c.path, rounds, round)
				}
			})
		}
	}
}

// seedTemplate creates one service through the domain and settles it READY
// with metrics, as a running service shows: the document every seeded
// service copies.
func seedTemplate(b *testing.B, e *env) *dbcloud.Service {
	b.Helper()
	s := e.readyService(map[string]any{"name": "template", "cpu_millis": "shared"})
	var svc *dbcloud.Service
	err := e.store.Update(b.Context(), func(tx dbcloud.Tx) error {
		var err error
		if svc, err = tx.FindService(e.a.ProjectID, s.ServiceID); err != nil {
			return err
		}
		svc.Metrics = &dbcloud.Metrics{MilliCPU: 12, MemoryMB: 41, StorageMB: 38, Measured: time.Now().UTC()}
		return tx.UpdateService(svc)
	})
	if err != nil {
		b.Fatal(err)
	}
	return svc
}

// seedServices inserts copies of tmpl straight into the store until the
// project has n services: creating 10,000 through the API would take
// minutes of quota checks and password hashing, and no PostgreSQL runs
// behind these anyway.
func seedServices(b *testing.B, e *env, tmpl *dbcloud.Service, n int) {
	b.Helper()
	start := time.Now()
	have := 0
	err := e.store.View(b.Context(), func(tx dbcloud.Tx) error {
		svcs, err := tx.ListServices(e.a.ProjectID)
		have = len(svcs)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	for have < n {
		err := e.store.Update(b.Context(), func(tx dbcloud.Tx) error {
			for range min(1000, n-have) {
				s := *tmpl
				s.ID, s.Name = dbcloud.NewID(), fmt.Sprintf("svc-%d", have)
				s.Created = tmpl.Created.Add(time.Duration(have) * time.Millisecond)
				s.Endpoint = &dbcloud.Endpoint{Host: tmpl.Endpoint.Host, Port: 20000 + have}
				if err := tx.InsertService(&s); err != nil {
					return err
				}
				have++
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("%d services in the store (seeded in %v)", n, time.Since(start).Round(time.Millisecond))
}

// compareWithMinimal measures ours and a minimal server answering our
// body for path, in alternating rounds, and reports both.
func compareWithMinimal(b *testing.B, e *env, ours *httptest.Server, path string, rounds int, round time.Duration) {
	auth := e.authHeader()
	oursClient := loadgen.NewClient(ours.Client().Transport.(*stdhttp.Transport).TLSClientConfig, apiClients)
	req, _ := stdhttp.NewRequest("GET", ours.URL+http.BasePath+path, nil)
	req.Header.Set("Authorization", auth)
	status, body, err := loadgen.Do(b.Context(), loadgen.NewRecorder(), oursClient, "probe", req)
	if err != nil || status != 200 {
		b.Fatalf("GET %s: %d %v", path, status, err)
	}
	minimal := httptest.NewUnstartedServer(stdhttp.HandlerFunc(func(w stdhttp.ResponseWriter, r *stdhttp.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	minimal.StartTLS()
	defer minimal.Close()
	minClient := loadgen.NewClient(minimal.Client().Transport.(*stdhttp.Transport).TLSClientConfig, apiClients)

	type target struct {
		name   string
		url    string
		client *stdhttp.Client
		rec    *loadgen.Recorder
		rates  []float64
	}
	targets := []*target{
		{name: "ours", url: ours.URL + http.BasePath + path, client: oursClient, rec: loadgen.NewRecorder()},
		{name: "minimal", url: minimal.URL + http.BasePath + path, client: minClient, rec: loadgen.NewRecorder()},
	}
	drive := func(t *target, rec *loadgen.Recorder, d time.Duration) time.Duration {
		return loadgen.Run(b.Context(), apiClients, d, func(ctx context.Context, _ int) {
			req, _ := stdhttp.NewRequest("GET", t.url, nil)
			req.Header.Set("Authorization", auth)
			loadgen.Do(ctx, rec, t.client, "get", req)
		})
	}
	// Warm-up: open every keep-alive connection before anything counts.
	for _, t := range targets {
		drive(t, loadgen.NewRecorder(), round/5)
	}
	for r := range rounds {
		order := targets
		if r%2 == 1 {
			order = []*target{targets[1], targets[0]}
		}
		for _, t := range order {
			rec := loadgen.NewRecorder()
			took := drive(t, rec, round)
			stats := rec.Stats()
			if len(stats) == 0 {
				b.Fatalf("%s GET %s: no answer in a round of %v", t.name, path, round)
			}
			s := stats[0]
			if s.Errors > 0 || s.Status[200] != s.Count {
				b.Fatalf("%s GET %s: statuses %v, %d errors (%s)", t.name, path, s.Status, s.Errors, s.LastError)
			}
			t.rates = append(t.rates, float64(s.Count)/took.Seconds())
			for _, d := range rec.Latencies("get") {
				t.rec.Add("get", 200, d, nil)
			}
		}
	}
	o, m := targets[0], targets[1]
	ourStats, minStats := o.rec.Stats()[0], m.rec.Stats()[0]
	b.ReportMetric(medianFloat(o.rates), "req/s")
	b.ReportMetric(loadgen.Ms(ourStats.P50), "p50-ms")
	b.ReportMetric(loadgen.Ms(ourStats.P99), "p99-ms")
	b.ReportMetric(medianFloat(m.rates), "min-req/s")
	b.ReportMetric(loadgen.Ms(minStats.P50), "min-p50-ms")
	b.ReportMetric(loadgen.Ms(minStats.P99), "min-p99-ms")
	b.ReportMetric(medianFloat(o.rates)/medianFloat(m.rates), "ours/min")
	b.ReportMetric(float64(len(body)), "body-bytes")
	b.ReportMetric(apiClients, "clients")
	b.ReportMetric(0, "ns/op")
	b.Logf("ours req/s by round %.0f, minimal %.0f; %d and %d requests", o.rates, m.rates, ourStats.Count, minStats.Count)
}

func medianFloat(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
