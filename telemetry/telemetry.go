// Package telemetry exposes dbcloud's own metrics and every service's
// latest database metrics in the Prometheus text format, on a listener of
// its own (serve's --metrics-listen, loopback only). It only translates:
// the numbers come from the HTTP handler's and the engine's hooks, the
// runtime's pool, and the services' latest samples in the store.
package telemetry

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"dbcloud"
)

// Sources are where the gauges read their values at scrape time; a nil
// function leaves its gauge out.
type Sources struct {
	// Store holds the services whose latest samples are exported.
	Store dbcloud.Store
	// QueueDepth is the engine's pending operations.
	QueueDepth func() int
	// LeasesHeld is the resource leases this process holds.
	LeasesHeld func() int
	// PoolReady and PoolTarget are the warm pool's prepared clusters and
	// the number it is refilled to.
	PoolReady  func() int
	PoolTarget func() int
}

// Telemetry is one registry with dbcloud's collectors. Create it with New.
type Telemetry struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	reconciles *prometheus.HistogramVec
	failures   *prometheus.CounterVec
}

// New returns a Telemetry reading src.
func New(src Sources) *Telemetry {
	t := &Telemetry{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dbcloud_http_requests_total",
			Help: "API requests by method, route pattern and status code.",
		}, []string{"method", "route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dbcloud_http_request_duration_seconds",
			Help:    "API request latency by method and route pattern.",
			Buckets: prometheus.DefBuckets,
		}, []string{"method", "route"}),
		reconciles: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dbcloud_engine_reconcile_duration_seconds",
			Help: "Duration of the engine's reconciles by resource kind.",
			// Reconciles take from milliseconds (nothing to do) to minutes
			// (a restore): exponential buckets from 10 ms to about 20 min.
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
		}, []string{"kind"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dbcloud_engine_reconcile_failures_total",
			Help: "Reconciles that ended in an error, by resource kind.",
		}, []string{"kind"}),
	}
	t.reg.MustRegister(t.requests, t.latency, t.reconciles, t.failures,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	gauge := func(name, help string, f func() int) {
		if f != nil {
			t.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
				func() float64 { return float64(f()) }))
		}
	}
	gauge("dbcloud_engine_queue_depth", "Operations pending at the engine's last dispatch.", src.QueueDepth)
	gauge("dbcloud_engine_leases_held", "Resource leases this process holds.", src.LeasesHeld)
	gauge("dbcloud_pool_clusters_ready", "Prepared PostgreSQL clusters waiting for creates.", src.PoolReady)
	gauge("dbcloud_pool_clusters_target", "Prepared clusters the pool is refilled to (--pool-size).", src.PoolTarget)
	if src.Store != nil {
		t.reg.MustRegister(&serviceCollector{store: src.Store})
	}
	return t
}

// ObserveRequest counts one API request; it fits http.Handler's Observe.
func (t *Telemetry) ObserveRequest(method, route string, status int, d time.Duration) {
	if route == "" {
		route = "unmatched" // one label for every unknown path: bounded
	}
	t.requests.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
	t.latency.WithLabelValues(method, route).Observe(d.Seconds())
}

// ObserveReconcile records one reconcile; it fits engine.Engine's Observe.
func (t *Telemetry) ObserveReconcile(kind string, d time.Duration, err error) {
	t.reconciles.WithLabelValues(kind).Observe(d.Seconds())
	if err != nil {
		t.failures.WithLabelValues(kind).Inc()
	}
}

// Handler serves /metrics in the Prometheus text format.
func (t *Telemetry) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(t.reg, promhttp.HandlerOpts{}))
	return mux
}

// serviceCollector exports every service's latest sample, labelled by
// project and service, read from the store at scrape time: nothing is
// cached, and a deleted service disappears with its row.
type serviceCollector struct {
	store dbcloud.Store
}

var (
	serviceLabels = []string{"project", "service"}
	descUp        = prometheus.NewDesc("dbcloud_service_ready", "1 when the service is READY, else 0.", serviceLabels, nil)
	descCPU       = prometheus.NewDesc("dbcloud_service_cpu_millicores", "CPU used by the primary, in millicores.", serviceLabels, nil)
	descMemory    = prometheus.NewDesc("dbcloud_service_memory_bytes", "Memory used by the primary.", serviceLabels, nil)
	descStorage   = prometheus.NewDesc("dbcloud_service_storage_bytes", "Size of the primary's data directory.", serviceLabels, nil)
	descConns     = prometheus.NewDesc("dbcloud_service_connections", "Client sessions on the primary.", serviceLabels, nil)
	descTPS       = prometheus.NewDesc("dbcloud_service_transactions_per_second", "Commits and rollbacks per second on the primary.", serviceLabels, nil)
	descWAL       = prometheus.NewDesc("dbcloud_service_wal_bytes_total", "The primary's WAL position in bytes.", serviceLabels, nil)
	descLag       = prometheus.NewDesc("dbcloud_service_replication_lag_bytes", "Replay lag of a standby or read replica node behind the primary.",
		append(serviceLabels, "replica_set", "ordinal"), nil)
	descPoolerClients = prometheus.NewDesc("dbcloud_service_pooler_client_connections", "Client connections of the service's pooler.", serviceLabels, nil)
	descPoolerServers = prometheus.NewDesc("dbcloud_service_pooler_server_connections", "Server connections of the service's pooler.", serviceLabels, nil)
	descMeasured      = prometheus.NewDesc("dbcloud_service_measured_timestamp_seconds", "When the exported sample was taken.", serviceLabels, nil)
)

func (c *serviceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descCPU, descMemory, descStorage, descConns, descTPS, descWAL, descLag,
		descPoolerClients, descPoolerServers, descMeasured} {
		ch <- d
	}
}

// scrapeTimeout bounds the store read of one scrape.
const scrapeTimeout = 10 * time.Second

func (c *serviceCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	var services []*dbcloud.Service
	err := c.store.View(ctx, func(tx dbcloud.Tx) error {
		projects, err := tx.ListProjects()
		if err != nil {
			return err
		}
		for _, p := range projects {
			svcs, err := tx.ListServices(p.ID)
			if err != nil {
				return err
			}
			services = append(services, svcs...)
		}
		return nil
	})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descUp, err)
		return
	}
	for _, s := range services {
		l := []string{s.ProjectID, s.ID}
		gauge := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(l, extra...)...)
		}
		ready := 0.0
		if s.Status == dbcloud.StatusReady {
			ready = 1
		}
		gauge(descUp, ready)
		m := s.Metrics
		if m == nil {
			continue
		}
		gauge(descCPU, float64(m.MilliCPU))
		gauge(descMemory, float64(m.MemoryMB<<20))
		gauge(descStorage, float64(m.StorageMB<<20))
		gauge(descMeasured, float64(m.Measured.Unix()))
		d := m.Database
		if d == nil {
			continue
		}
		gauge(descConns, float64(d.Connections))
		gauge(descTPS, d.TransactionsPerSec)
		ch <- prometheus.MustNewConstMetric(descWAL, prometheus.CounterValue, float64(d.WALBytes), l...)
		for _, r := range d.Replication {
			gauge(descLag, float64(r.LagBytes), r.ReplicaSetID, strconv.Itoa(r.Ordinal))
		}
		if d.PoolerClients != nil {
			gauge(descPoolerClients, float64(*d.PoolerClients))
		}
		if d.PoolerServers != nil {
			gauge(descPoolerServers, float64(*d.PoolerServers))
		}
	}
}
