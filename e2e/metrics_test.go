package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/internal/promtest"
	"dbcloud/internal/testports"
)

// metricsRequest is the original CLI's MetricsSeriesRequest, as its
// `tiger service metrics series` and MCP tool send it.
type metricsRequest struct {
	Name          string               `json:"name"`
	From          string               `json:"from"`
	To            string               `json:"to"`
	BucketSeconds *int                 `json:"bucket_seconds,omitempty"`
	Fn            *string              `json:"fn,omitempty"`
	Filters       *[]map[string]string `json:"filters,omitempty"`
}

type metricSeries struct {
	Labels map[string]string `json:"labels"`
	Data   []struct {
		Time  time.Time `json:"time"`
		Value *float64  `json:"value"`
	} `json:"data"`
}

// series asks for one series over the last 10 minutes, as the CLI would.
func (s *server) series(id, name, fn string, filters ...map[string]string) []metricSeries {
	s.t.Helper()
	now := time.Now().UTC()
	req := metricsRequest{Name: name, From: now.Add(-10 * time.Minute).Format(time.RFC3339), To: now.Add(time.Minute).Format(time.RFC3339)}
	if fn != "" {
		req.Fn = &fn
	}
	if len(filters) > 0 {
		req.Filters = &filters
	}
	var out []metricSeries
	if code := s.call("POST", s.services()+"/"+id+"/metrics/series", req, &out); code != 200 {
		s.t.Fatalf("metrics/series %s: %d", name, code)
	}
	return out
}

// total is the sum of a series' non-null values; latest its newest value.
func total(ms []metricSeries) (sum, latest float64) {
	for _, m := range ms {
		for _, d := range m.Data {
			if d.Value != nil {
				sum += *d.Value
				latest = *d.Value
			}
		}
	}
	return sum, latest
}

// TestMetrics_HistoryAndPrometheus: real samples of a service with an HA
// standby and a pooler, while pgbench runs through the pooler. The
// original CLI's two calls see the series grow; Prometheus's parser reads
// the scrape of --metrics-listen.
func TestMetrics_HistoryAndPrometheus(t *testing.T) {
	pgbench := "/usr/lib/postgresql/15/bin/pgbench"
	if _, err := os.Stat(pgbench); err != nil {
		t.Skip("pgbench not installed")
	}
	metricsAddr := "127.0.0.1:" + strconv.Itoa(testports.MustPort(t))
	s := newServer(t, "--metrics-listen", metricsAddr)
	created := s.create(map[string]any{"name": "metrics", "replica_count": 1})
	id := created.ServiceID
	svc := s.waitStatus(id, "READY", 3*time.Minute)
	if code := s.call("POST", s.services()+"/"+id+"/enablePooler", nil, nil); code != 200 {
		t.Fatalf("enablePooler: %d", code)
	}
	s.waitStatus(id, "READY", 2*time.Minute)
	pooler := s.waitPooler(id, true, 2*time.Minute)

	var names []string
	if code := s.call("GET", s.services()+"/"+id+"/metrics/available-series", nil, &names); code != 200 {
		t.Fatalf("available-series: %d", code)
	}
	for _, want := range []string{dbcloud.SeriesCPUUsage, dbcloud.SeriesMemoryUsage, dbcloud.SeriesDiskUsage,
		dbcloud.SeriesConnections, dbcloud.SeriesTransactions, dbcloud.SeriesWALBytes, dbcloud.SeriesReplicationLag,
		dbcloud.SeriesPoolerClients, dbcloud.SeriesPoolerServers} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("available-series %v lacks %s", names, want)
		}
	}

	env := append(os.Environ(), "PGPASSWORD="+created.InitialPassword, "PGSSLMODE=require")
	init := exec.Command(pgbench, "-i", "-s", "1", "-q", "-h", svc.Endpoint.Host, "-p", strconv.Itoa(svc.Endpoint.Port), "-U", "tsdbadmin", "tsdb")
	init.Env = env
	if out, err := init.CombinedOutput(); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	samplesBefore, _ := total(s.series(id, dbcloud.SeriesTransactions, "COUNT"))
	_, walBefore := total(s.series(id, dbcloud.SeriesWALBytes, ""))

	host, port, _ := net.SplitHostPort(pooler)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	load := exec.CommandContext(ctx, pgbench, "-c", "4", "-T", "600", "-n", "-h", host, "-p", port, "-U", "tsdbadmin", "tsdb")
	load.Env = env
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	defer load.Wait()
	defer cancel()

	// While the load runs: more samples, WAL written, transactions and
	// pooler clients seen. Each check polls until it holds.
	deadline := time.Now().Add(3 * time.Minute)
	for _, c := range []struct {
		what string
		ok   func() bool
	}{
		{"more transaction samples", func() bool {
			n, _ := total(s.series(id, dbcloud.SeriesTransactions, "COUNT"))
			return n >= samplesBefore+3
		}},
		{"WAL growing", func() bool {
			_, wal := total(s.series(id, dbcloud.SeriesWALBytes, ""))
			return wal > walBefore
		}},
		{"transactions per second above 0", func() bool {
			_, tps := total(s.series(id, dbcloud.SeriesTransactions, "MAX"))
			return tps > 0
		}},
		{"pooler clients and server connections", func() bool {
			_, clients := total(s.series(id, dbcloud.SeriesPoolerClients, ""))
			_, servers := total(s.series(id, dbcloud.SeriesPoolerServers, ""))
			return clients >= 4 && servers >= 1
		}},
		{"connections of the primary", func() bool {
			_, conns := total(s.series(id, dbcloud.SeriesConnections, "", map[string]string{"key": "role", "value": "primary"}))
			return conns >= 1
		}},
		{"replication lag of the standby", func() bool {
			lag := s.series(id, dbcloud.SeriesReplicationLag, "")
			return len(lag) == 1 && lag[0].Labels["role"] == "replica" && lag[0].Labels["ordinal"] != ""
		}},
	} {
		for !c.ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not seen while pgbench ran", c.what)
			}
			time.Sleep(time.Second)
		}
	}
	// A metric the original refuses fn on is refused the same way.
	var e struct{ Code string }
	fn := "AVG"
	now := time.Now().UTC()
	if code := s.call("POST", s.services()+"/"+id+"/metrics/series", metricsRequest{Name: dbcloud.SeriesCPUUsage,
		From: now.Add(-time.Hour).Format(time.RFC3339), To: now.Format(time.RFC3339), Fn: &fn}, &e); code != 400 || e.Code != "INVALID_REQUEST" {
		t.Errorf("fn on %s: %d %s, want 400 INVALID_REQUEST", dbcloud.SeriesCPUUsage, code, e.Code)
	}

	fams := promtest.Scrape(t, "http://"+metricsAddr+"/metrics")
	var conns float64
	for _, m := range fams["dbcloud_service_connections"].GetMetric() {
		if promtest.Label(m, "service") == id && promtest.Label(m, "project") == s.boot.ProjectID {
			conns = promtest.Value(m)
		}
	}
	if conns < 1 {
		t.Errorf("dbcloud_service_connections{service=%q} = %g, want the load's sessions", id, conns)
	}
	var seriesCalls float64
	for _, m := range fams["dbcloud_http_requests_total"].GetMetric() {
		if promtest.Label(m, "route") == "/public/api/v1/projects/{project_id}/services/{service_id}/metrics/series" && promtest.Label(m, "code") == "200" {
			seriesCalls = promtest.Value(m)
		}
	}
	if seriesCalls < 6 {
		t.Errorf("dbcloud_http_requests_total for metrics/series 200 = %g, want this test's calls", seriesCalls)
	}
	for _, name := range []string{"dbcloud_engine_queue_depth", "dbcloud_engine_leases_held", "dbcloud_pool_clusters_ready",
		"dbcloud_engine_reconcile_duration_seconds", "dbcloud_http_request_duration_seconds", "dbcloud_service_replication_lag_bytes"} {
		if fams[name] == nil {
			t.Errorf("the scrape lacks %s", name)
		}
	}
}

// TestMetrics_IdleServiceCostsLess: an idle shared service costs its host
// less (issue 33). Its samples are read over one kept session instead of
// a new backend each (pg_stat_database counts the sessions of the
// postgres database, where dbcloud's own go), and autovacuum looks at it
// every 5 minutes rather than PostgreSQL's every minute.
func TestMetrics_IdleServiceCostsLess(t *testing.T) {
	localOnly(t, "counts the sessions the local runtime opens on its instances")
	s := newServer(t)
	created := s.create(map[string]any{"name": "idle", "cpu_millis": "shared"})
	id := created.ServiceID
	svc := s.waitStatus(id, "READY", 2*time.Minute)
	// The first snapshot, taken at once, opens sessions of its own.
	s.waitSnapshot(id, time.Time{}, 2*time.Minute)
	c := s.mustConnect(svc, created.InitialPassword)
	ctx := t.Context()
	var naptime string
	if err := c.QueryRow(ctx, `SHOW autovacuum_naptime`).Scan(&naptime); err != nil || naptime != "5min" {
		t.Errorf("autovacuum_naptime of a shared service: %q %v, want 5min", naptime, err)
	}
	sessions := func() int64 {
		var n int64
		if err := c.QueryRow(ctx, `SELECT sessions FROM pg_stat_database WHERE datname = 'postgres'`).Scan(&n); err != nil {
			t.Fatalf("sessions: %v", err)
		}
		return n
	}
	s.waitMeasured(id, time.Now(), time.Minute) // the kept session is open from here
	before := sessions()
	const samples = 3
	for range samples {
		s.waitMeasured(id, time.Now(), time.Minute)
	}
	if n := sessions() - before; n != 0 {
		t.Errorf("%d sessions opened on the postgres database over %d samples of an idle service, want none (one kept session)", n, samples)
	}
}
