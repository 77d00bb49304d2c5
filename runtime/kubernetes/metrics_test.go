package kubernetes_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/runtime/kubernetes"
)

// exporterPage is a page of CNPG 1.27's exporter as an instance serves it on
// port 9187: the default monitoring queries' metrics (cnpg_pg_database,
// cnpg_backends), the collector's (cnpg_collector_*) and the Go runtime's.
const exporterPage = `# HELP cnpg_backends_total Number of backends
# TYPE cnpg_backends_total gauge
cnpg_backends_total{application_name="cnpg-instance-manager",datname="postgres",state="idle",usename="postgres"} 2
cnpg_backends_total{application_name="psql",datname="tsdb",state="active",usename="tsdbadmin"} 3
cnpg_backends_total{application_name="app",datname="tsdb",state="idle",usename="tsdbadmin"} 4
cnpg_backends_total{application_name="svc-x-2",datname="",state="active",usename="streaming_replica"} 1
# HELP cnpg_collector_pg_wal Total size in bytes of WAL segments in the '/var/lib/postgresql/data/pgdata/pg_wal' directory  computed as (wal_segment_size * count)
# TYPE cnpg_collector_pg_wal gauge
cnpg_collector_pg_wal{value="count"} 4
cnpg_collector_pg_wal{value="keep"} 32
cnpg_collector_pg_wal{value="max"} 64
cnpg_collector_pg_wal{value="min"} 5
cnpg_collector_pg_wal{value="size"} 6.7108864e+07
cnpg_collector_pg_wal{value="volume_size"} 0
# HELP cnpg_collector_up 1 if PostgreSQL is up, 0 otherwise.
# TYPE cnpg_collector_up gauge
cnpg_collector_up{cluster="svc-x"} 1
# HELP cnpg_pg_database_size_bytes Disk space used by the database
# TYPE cnpg_pg_database_size_bytes gauge
cnpg_pg_database_size_bytes{datname="postgres"} 7.606831e+06
cnpg_pg_database_size_bytes{datname="template0"} 7.537155e+06
cnpg_pg_database_size_bytes{datname="template1"} 7.684655e+06
cnpg_pg_database_size_bytes{datname="tsdb"} 1.048576e+08
# HELP go_memstats_alloc_bytes Number of bytes allocated in heap and currently in use.
# TYPE go_memstats_alloc_bytes gauge
go_memstats_alloc_bytes 8.123456e+06
`

// TestParseExporterMetrics maps the exporter's page: storage is every
// database plus pg_wal, connections leave out CNPG's own sessions, and
// what the exporter does not measure (CPU, memory) stays zero.
func TestParseExporterMetrics(t *testing.T) {
	at := time.Date(2026, 11, 23, 17, 0, 0, 0, time.UTC)
	m, err := kubernetes.ParseExporterMetrics(strings.NewReader(exporterPage), at)
	if err != nil {
		t.Fatal(err)
	}
	wantBytes := int64(7606831 + 7537155 + 7684655 + 104857600 + 67108864)
	if m.StorageMB != wantBytes>>20 || m.MilliCPU != 0 || m.MemoryMB != 0 || !m.Measured.Equal(at) {
		t.Fatalf("metrics %+v, want storage %d MB", m, wantBytes>>20)
	}
	if m.Database == nil || m.Database.Connections != 7 {
		t.Fatalf("database metrics %+v, want 7 connections", m.Database)
	}
	// A page without PostgreSQL's statistics (the collector failed) is no
	// measurement, not a zero one.
	if _, err := kubernetes.ParseExporterMetrics(strings.NewReader("go_memstats_alloc_bytes 1\n"), at); err == nil {
		t.Fatal("a page without cnpg_pg_database_size_bytes measured")
	}
	if _, err := kubernetes.ParseExporterMetrics(strings.NewReader("not { a metric"), at); err == nil {
		t.Fatal("garbage measured")
	}
}

// exporter serves canned pages by pod (a test double of the pod proxy:
// no kubelet runs here).
type exporter map[string]string

func (e exporter) PodMetrics(_ context.Context, _, pod string) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(e[pod])), nil
}

// TestMeasureReadsThePrimary: a measuring check reads the current
// primary's exporter, against the real apiserver's Cluster status.
func TestMeasureReadsThePrimary(t *testing.T) {
	ctx := testContext(t)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.DefaultSize, Environment: dbcloud.EnvDev, Replicas: 1, Running: true})
	name := kubernetes.ClusterName(svc)
	rt := newRuntime(t, kubernetes.Config{Metrics: exporter{
		name + "-2": exporterPage,
		name + "-1": "cnpg_pg_database_size_bytes{datname=\"tsdb\"} 1\n",
	}})
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	writeStatus(t, ctx, rt, svc, healthy(name, name+"-2", 2))
	obs, err := rt.CheckService(ctx, svc, true)
	if err != nil || !obs.Running || obs.Metrics == nil {
		t.Fatalf("%v %+v", err, obs)
	}
	if obs.Metrics.Database.Connections != 7 {
		t.Fatalf("measured %+v, not the primary %s-2", obs.Metrics, name)
	}
	if obs, _ := rt.CheckService(ctx, svc, false); obs.Metrics != nil {
		t.Fatal("measured when not asked to")
	}
}
