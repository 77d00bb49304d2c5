package telemetry_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/internal/promtest"
	"dbcloud/sqlite"
	"dbcloud/telemetry"
)

func TestTelemetry_Scrape(t *testing.T) {
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := cloud.New(s, nil, cloud.DefaultConfig(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	b, err := c.Bootstrap(t.Context(), "admin", "admin@example.com")
	if err != nil {
		t.Fatal(err)
	}
	clients, servers := int64(3), int64(2)
	svc := &dbcloud.Service{ID: "abcde12345", ProjectID: b.Project.ID, Name: "db", Status: dbcloud.StatusReady,
		Metrics: &dbcloud.Metrics{MilliCPU: 250, MemoryMB: 64, StorageMB: 40, Measured: time.Now(),
			Database: &dbcloud.DatabaseMetrics{Connections: 5, TransactionsPerSec: 12.5, WALBytes: 1 << 24,
				Replication:   []dbcloud.ReplicationLag{{Ordinal: 1, LagBytes: 4096}, {ReplicaSetID: "rs00000001", LagBytes: 8192}},
				PoolerClients: &clients, PoolerServers: &servers}}}
	if err := s.Update(t.Context(), func(tx dbcloud.Tx) error { return tx.InsertService(svc) }); err != nil {
		t.Fatal(err)
	}
	tel := telemetry.New(telemetry.Sources{
		Store: s, QueueDepth: func() int { return 7 }, LeasesHeld: func() int { return 2 },
		PoolReady: func() int { return 1 }, PoolTarget: func() int { return 2 },
	})
	tel.ObserveRequest("GET", "/public/api/v1/projects/{project_id}/services", 200, 30*time.Millisecond)
	tel.ObserveRequest("GET", "/public/api/v1/projects/{project_id}/services", 200, 10*time.Millisecond)
	tel.ObserveRequest("GET", "", 404, time.Millisecond)
	tel.ObserveReconcile("service", 2*time.Second, nil)
	tel.ObserveReconcile("service", time.Second, errors.New("boom"))
	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	fams := promtest.Scrape(t, srv.URL+"/metrics")

	gauge := func(name string) float64 {
		t.Helper()
		f := fams[name]
		if f == nil || len(f.GetMetric()) == 0 {
			t.Fatalf("no %s in the scrape", name)
		}
		return promtest.Value(f.GetMetric()[0])
	}
	for name, want := range map[string]float64{
		"dbcloud_engine_queue_depth": 7, "dbcloud_engine_leases_held": 2,
		"dbcloud_pool_clusters_ready": 1, "dbcloud_pool_clusters_target": 2,
		"dbcloud_engine_reconcile_failures_total":   1,
		"dbcloud_service_ready":                     1,
		"dbcloud_service_cpu_millicores":            250,
		"dbcloud_service_memory_bytes":              64 << 20,
		"dbcloud_service_connections":               5,
		"dbcloud_service_transactions_per_second":   12.5,
		"dbcloud_service_wal_bytes_total":           1 << 24,
		"dbcloud_service_pooler_client_connections": 3,
		"dbcloud_service_pooler_server_connections": 2,
	} {
		if got := gauge(name); got != want {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
	m := fams["dbcloud_service_cpu_millicores"].GetMetric()[0]
	if promtest.Label(m, "project") != b.Project.ID || promtest.Label(m, "service") != "abcde12345" {
		t.Errorf("service labels %v, want project %s and service abcde12345", m.GetLabel(), b.Project.ID)
	}
	if lag := fams["dbcloud_service_replication_lag_bytes"].GetMetric(); len(lag) != 2 {
		t.Errorf("%d replication lag series, want one per node", len(lag))
	}
	requests := map[string]float64{}
	for _, m := range fams["dbcloud_http_requests_total"].GetMetric() {
		requests[promtest.Label(m, "route")+" "+promtest.Label(m, "code")] = m.GetCounter().GetValue()
	}
	if requests["/public/api/v1/projects/{project_id}/services 200"] != 2 || requests["unmatched 404"] != 1 {
		t.Errorf("requests by route and code = %v", requests)
	}
	h := fams["dbcloud_http_request_duration_seconds"].GetMetric()
	if len(h) != 2 || h[0].GetHistogram().GetSampleCount()+h[1].GetHistogram().GetSampleCount() != 3 {
		t.Errorf("latency histograms %v, want 3 requests over two routes", h)
	}
	if r := fams["dbcloud_engine_reconcile_duration_seconds"].GetMetric(); len(r) != 1 || r[0].GetHistogram().GetSampleCount() != 2 {
		t.Errorf("reconcile histogram %v, want 2 service reconciles", r)
	}
}
