package storetest

import (
	"fmt"
	"testing"
	"time"

	"dbcloud/history"

	"dbcloud"
)

// benchRoundServices is how many services one health round samples in the
// history benchmark: the default quota of one project.
const benchRoundServices = 100

// roundSamples is one health round's samples: every service with an HA
// standby and a pooler, so every series of dbcloud.Samples.
func roundSamples(at time.Time) []dbcloud.SeriesSample {
	var out []dbcloud.SeriesSample
	clients, servers := int64(10), int64(4)
	for i := range benchRoundServices {
		svc := &dbcloud.Service{ID: fmt.Sprintf("svc%07d", i), Spec: dbcloud.ServiceSpec{Size: dbcloud.Size{CPUMillis: 1000, MemoryGBs: 4}}}
		out = append(out, dbcloud.Samples(svc, &dbcloud.Metrics{MilliCPU: 120, MemoryMB: 300, StorageMB: 40, Measured: at,
			Database: &dbcloud.DatabaseMetrics{Connections: 12, TransactionsPerSec: 250, WALBytes: at.Unix() * 1000,
				Replication: []dbcloud.ReplicationLag{{Ordinal: 1, LagBytes: 1024}}, PoolerClients: &clients, PoolerServers: &servers}})...)
	}
	return out
}

// BenchmarkRecordHistory measures one health round's write of the metrics
// history: 100 services' samples merged into three tiers in one batch.
func BenchmarkRecordHistory(b *testing.B, newDB NewDB) {
	s, ok := MustOpen(b, newDB).(dbcloud.SeriesStore)
	if !ok {
		b.Fatal("store does not implement dbcloud.SeriesStore")
	}
	at := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	h := &history.Series{Store: s, Now: func() time.Time { return at }}
	n := 0
	for b.Loop() {
		at = at.Add(5 * time.Second)
		samples := roundSamples(at)
		n = len(samples)
		if err := h.Record(b.Context(), samples); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n), "samples/op")
}

// BenchmarkQueryHistory measures the metrics preview's read: one service's
// series over its last day, by minute, from a day of 5-second samples.
func BenchmarkQueryHistory(b *testing.B, newDB NewDB) {
	s, ok := MustOpen(b, newDB).(dbcloud.SeriesStore)
	if !ok {
		b.Fatal("store does not implement dbcloud.SeriesStore")
	}
	start := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	now := start
	h := &history.Series{Store: s, Now: func() time.Time { return now }}
	var batch []dbcloud.SeriesSample
	for ; now.Before(start.Add(24 * time.Hour)); now = now.Add(5 * time.Second) {
		batch = append(batch, dbcloud.SeriesSample{ServiceID: "svc1", Name: dbcloud.SeriesConnections,
			Labels: map[string]string{"role": "primary"}, Time: now, Value: 3})
	}
	if err := h.Record(b.Context(), batch); err != nil {
		b.Fatal(err)
	}
	q := dbcloud.SeriesQuery{Name: dbcloud.SeriesConnections, From: now.Add(-24 * time.Hour), To: now, Bucket: time.Minute}
	for b.Loop() {
		got, err := h.Query(b.Context(), "svc1", q)
		if err != nil || len(got) != 1 || len(got[0].Points) != 1440 {
			b.Fatalf("query: %d series, %v", len(got), err)
		}
	}
}
