package kubernetes

import (
	"context"
	"fmt"
	"io"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"dbcloud"
)

// MetricsPort is where CNPG's instance manager serves each instance's
// Prometheus metrics (plain HTTP unless spec.monitoring.tls is on).
const MetricsPort = "9187"

// PodMetricsReader reads an instance's exporter.
type PodMetricsReader interface {
	PodMetrics(ctx context.Context, ns, pod string) (io.ReadCloser, error)
}

// podMetrics goes through the apiserver's pod proxy, so dbcloud outside
// the cluster reads the exporter as it reads pod logs, with no route to
// the pods (RBAC: pods/proxy get).
type podMetrics struct{ cs kubernetes.Interface }

func newPodMetrics(rc *rest.Config) (PodMetricsReader, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return podMetrics{cs}, nil
}

func (p podMetrics) PodMetrics(ctx context.Context, ns, pod string) (io.ReadCloser, error) {
	return p.cs.CoreV1().Pods(ns).ProxyGet("http", pod, MetricsPort, "/metrics", nil).Stream(ctx)
}

// Exporter metrics mapped to the API's (CNPG's default monitoring queries,
// config/manager/default-monitoring.yaml, and its collector, wal.go).
const (
	metricDatabaseSize = "cnpg_pg_database_size_bytes"
	metricWALDirectory = "cnpg_collector_pg_wal"
	metricBackends     = "cnpg_backends_total"
)

// internalUsers are CNPG's own sessions (its instance manager connects as
// postgres; standbys stream as streaming_replica), left out of the
// connection count as the local runtime leaves out dbcloud's own; tenants
// cannot be postgres (enableSuperuserAccess is off).
var internalUsers = map[string]bool{"postgres": true, "streaming_replica": true}

// ParseExporterMetrics maps one instance's exporter page to the API's
// metrics. What the exporter does not measure stays zero: CPU and memory
// (CNPG exports PostgreSQL's statistics and the instance manager's Go
// runtime, not the container's usage, which is the metrics API's), the WAL
// position and transaction rate (docs/kubernetes.md).
func ParseExporterMetrics(r io.Reader, measured time.Time) (*dbcloud.Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("exporter metrics: %w", err)
	}
	if fams[metricDatabaseSize] == nil {
		// The page answered but without PostgreSQL's statistics (the
		// collector failed): no measurement rather than a zero one.
		return nil, fmt.Errorf("exporter metrics: no %s", metricDatabaseSize)
	}
	var bytes float64
	for _, m := range fams[metricDatabaseSize].GetMetric() {
		bytes += gauge(m)
	}
	for _, m := range fams[metricWALDirectory].GetMetric() {
		if label(m, "value") == "size" {
			bytes += gauge(m)
		}
	}
	var conns float64
	for _, m := range fams[metricBackends].GetMetric() {
		if !internalUsers[label(m, "usename")] {
			conns += gauge(m)
		}
	}
	return &dbcloud.Metrics{
		StorageMB: int64(bytes) / (1 << 20), Measured: measured,
		Database: &dbcloud.DatabaseMetrics{Connections: int64(conns)},
	}, nil
}

func gauge(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// measure reads the current primary's exporter; a failure is logged and
// leaves the service unmeasured this round, as the local runtime does when
// it cannot measure.
func (rt *Runtime) measure(ctx context.Context, ns string, obs *dbcloud.Observation) *dbcloud.Metrics {
	if rt.cfg.Metrics == nil || len(obs.Instances) == 0 || obs.Instances[0].Role != "primary" {
		return nil
	}
	pod := obs.Instances[0].ID
	body, err := rt.cfg.Metrics.PodMetrics(ctx, ns, pod)
	if err != nil {
		rt.log.Warn("read instance metrics", "namespace", ns, "pod", pod, "error", err)
		return nil
	}
	defer body.Close()
	m, err := ParseExporterMetrics(io.LimitReader(body, 16<<20), time.Now())
	if err != nil {
		rt.log.Warn("read instance metrics", "namespace", ns, "pod", pod, "error", err)
		return nil
	}
	return m
}
