package history_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/history"
	"dbcloud/sqlite"
)

// newHistory returns a History over a fresh SQLite store, with a clock the
// test sets.
func newHistory(t *testing.T, now *time.Time) *history.Series {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &history.Series{Store: s, Now: func() time.Time { return *now }}
}

func values(points []dbcloud.SeriesPoint) string {
	out := ""
	for _, p := range points {
		if p.Value == nil {
			out += " null"
		} else {
			out += fmt.Sprintf(" %g", *p.Value)
		}
	}
	return out
}

func TestHistory_Query(t *testing.T) {
	t0 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	now := t0.Add(10 * time.Minute)
	h := newHistory(t, &now)
	svc := &dbcloud.Service{ID: "svc1", Spec: dbcloud.ServiceSpec{Size: dbcloud.Size{CPUMillis: 1000, MemoryGBs: 4}}}
	// Samples every 20 s in minutes 0, 1 and 3 (minute 2 is a gap); the
	// WAL counter restarts from 0 in minute 3; transactions per second are
	// 0, 2, 4, ... 16, so an average differs from a sum.
	var samples []dbcloud.SeriesSample
	wal := []float64{100, 200, 300, 400, 500, 600, 10, 20, 30}
	i := 0
	for _, m := range []int{0, 1, 3} {
		for s := 0; s < 60; s += 20 {
			at := t0.Add(time.Duration(m)*time.Minute + time.Duration(s)*time.Second)
			samples = append(samples, dbcloud.Samples(svc, &dbcloud.Metrics{
				MilliCPU: int64(10 * (i + 1)), Measured: at,
				Database: &dbcloud.DatabaseMetrics{
					Connections: int64(i), WALBytes: int64(wal[i]), TransactionsPerSec: float64(2 * i),
					Replication: []dbcloud.ReplicationLag{{Ordinal: 1, LagBytes: 5}, {ReplicaSetID: "rs1", Ordinal: 0, LagBytes: 7}},
				},
			})...)
			i++
		}
	}
	if err := h.Record(t.Context(), samples); err != nil {
		t.Fatal(err)
	}
	q := func(name string, fn dbcloud.SeriesFn, filters ...dbcloud.LabelFilter) dbcloud.SeriesQuery {
		return dbcloud.SeriesQuery{Name: name, From: t0, To: t0.Add(4 * time.Minute), Fn: fn, Filters: filters}
	}
	t.Run("OK", func(t *testing.T) {
		for _, tt := range []struct {
			q    dbcloud.SeriesQuery
			want string
		}{
			// The default is LAST, buckets of a minute for an hour's window, gaps null.
			{q(dbcloud.SeriesCPUUsage, ""), " 30 60 null 90"},
			{q(dbcloud.SeriesCPUTotal, ""), " 1000 1000 null 1000"},
			{q(dbcloud.SeriesTransactions, dbcloud.FnAvg), " 2 8 null 14"},
			{q(dbcloud.SeriesTransactions, dbcloud.FnSum), " 6 24 null 42"},
			{q(dbcloud.SeriesWALBytes, dbcloud.FnAvg), " 200 500 null 20"},
			{q(dbcloud.SeriesWALBytes, dbcloud.FnMax), " 300 600 null 30"},
			{q(dbcloud.SeriesWALBytes, dbcloud.FnMin), " 100 400 null 10"},
			{q(dbcloud.SeriesWALBytes, dbcloud.FnSum), " 600 1500 null 60"},
			{q(dbcloud.SeriesWALBytes, dbcloud.FnCount), " 3 3 null 3"},
			// The restart in minute 3 counts from 0: 10 + 10 + 10.
			{q(dbcloud.SeriesWALBytes, dbcloud.FnIncrease), " 200 300 null 30"},
			{q(dbcloud.SeriesWALBytes, dbcloud.FnRate), " 3.3333333333333335 5 null 0.5"},
		} {
			got, err := h.Query(t.Context(), "svc1", tt.q)
			if err != nil {
				t.Fatalf("%s %s: %v", tt.q.Name, tt.q.Fn, err)
			}
			if len(got) != 1 || got[0].Labels["role"] != "primary" || values(got[0].Points) != tt.want {
				t.Errorf("%s %s = %d series %v%s, want one primary series%s", tt.q.Name, tt.q.Fn, len(got), got[0].Labels, values(got[0].Points), tt.want)
			}
			if len(got) == 1 && !got[0].Points[1].Time.Equal(t0.Add(time.Minute)) {
				t.Errorf("bucket 1 starts at %s, want %s", got[0].Points[1].Time, t0.Add(time.Minute))
			}
		}
	})
	t.Run("Labels", func(t *testing.T) {
		got, err := h.Query(t.Context(), "svc1", q(dbcloud.SeriesReplicationLag, ""))
		if err != nil || len(got) != 2 {
			t.Fatalf("lag = %+v, %v; want one series per node", got, err)
		}
		if got[0].Labels["ordinal"] != "0" || got[0].Labels["replica_set_id"] != "rs1" || got[1].Labels["ordinal"] != "1" || got[1].Labels["role"] != "replica" {
			t.Errorf("labels %v and %v, want the replica set node, then HA replica 1", got[0].Labels, got[1].Labels)
		}
		got, err = h.Query(t.Context(), "svc1", q(dbcloud.SeriesReplicationLag, "", dbcloud.LabelFilter{Key: "replica_set_id", Value: "rs1"}))
		if err != nil || len(got) != 1 || values(got[0].Points) != " 7 7 null 7" {
			t.Errorf("filtered lag = %+v, %v; want the replica set node only", got, err)
		}
		got, err = h.Query(t.Context(), "svc1", q(dbcloud.SeriesCPUUsage, "", dbcloud.LabelFilter{Key: "role", Value: "replica"}))
		if err != nil || len(got) != 0 {
			t.Errorf("cpu of role replica = %+v, %v; want no series", got, err)
		}
		got, err = h.Query(t.Context(), "other", q(dbcloud.SeriesCPUUsage, ""))
		if err != nil || len(got) != 0 {
			t.Errorf("another service's cpu = %+v, %v; want no series", got, err)
		}
	})
	t.Run("Buckets", func(t *testing.T) {
		// 90 s buckets come from the raw samples.
		got, err := h.Query(t.Context(), "svc1", dbcloud.SeriesQuery{Name: dbcloud.SeriesConnections, From: t0, To: t0.Add(3 * time.Minute), Bucket: 90 * time.Second})
		if err != nil || len(got) != 1 || values(got[0].Points) != " 4 5" {
			t.Errorf("90 s buckets = %+v, %v; want 4 5", got, err)
		}
		// Hour buckets come from the hour tier: its rows' sums over their
		// counts, 72 / 9.
		got, err = h.Query(t.Context(), "svc1", dbcloud.SeriesQuery{Name: dbcloud.SeriesTransactions, From: t0, To: t0.Add(time.Hour), Bucket: time.Hour, Fn: dbcloud.FnAvg})
		if err != nil || len(got) != 1 {
			t.Errorf("hour AVG = %d series, %v; want one", len(got), err)
		} else if v := values(got[0].Points); v != " 8" {
			t.Errorf("hour AVG =%s, want 8", v)
		}
		// A day-long window defaults to hour buckets.
		got, err = h.Query(t.Context(), "svc1", dbcloud.SeriesQuery{Name: dbcloud.SeriesConnections, From: t0.Add(-12 * time.Hour), To: t0.Add(12 * time.Hour)})
		if err != nil || len(got) != 1 || len(got[0].Points) != 24 || values(got[0].Points[12:13]) != " 8" {
			t.Errorf("day window = %d series, %v; want 24 hour buckets, 8 at 10:00", len(got), err)
			if len(got) == 1 {
				t.Logf("values%s", values(got[0].Points))
			}
		}
	})
	t.Run("ErrInvalid", func(t *testing.T) {
		old := t0.Add(-30 * 24 * time.Hour)
		for name, q := range map[string]dbcloud.SeriesQuery{
			"unknown name":       {Name: "nope", From: t0, To: now},
			"no name":            {From: t0, To: now},
			"no from":            {Name: dbcloud.SeriesConnections, To: now},
			"negative bucket":    {Name: dbcloud.SeriesConnections, From: t0, To: now, Bucket: -1},
			"bucket over a year": {Name: dbcloud.SeriesConnections, From: t0, To: now, Bucket: 400 * 24 * time.Hour},
			"window of ages":     {Name: dbcloud.SeriesConnections, From: time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), To: time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC)},
			"filter no value":    q(dbcloud.SeriesConnections, "", dbcloud.LabelFilter{Key: "role"}),
			"from after to":      {Name: dbcloud.SeriesConnections, From: now, To: t0},
			"fn on a fixed one":  q(dbcloud.SeriesCPUUsage, dbcloud.FnAvg),
			"rate of a gauge":    q(dbcloud.SeriesTransactions, dbcloud.FnRate),
			"percentile":         q(dbcloud.SeriesWALBytes, dbcloud.FnP99),
			"unknown fn":         q(dbcloud.SeriesWALBytes, "MEDIAN"),
			"bucket below 60":    {Name: dbcloud.SeriesConnections, From: t0, To: now, Bucket: 30 * time.Second},
			"too many buckets":   {Name: dbcloud.SeriesConnections, From: t0.Add(-20 * 24 * time.Hour), To: now, Bucket: time.Minute},
			"too fine when old":  {Name: dbcloud.SeriesConnections, From: old, To: old.Add(time.Hour), Bucket: time.Minute},
			"seconds not minute": {Name: dbcloud.SeriesConnections, From: t0.Add(-2 * 24 * time.Hour), To: now, Bucket: 90 * time.Second},
		} {
			_, err := h.Query(t.Context(), "svc1", q)
			var e *dbcloud.Error
			if !errors.As(err, &e) || e.Kind != dbcloud.KindInvalid {
				t.Errorf("%s: err %v, want KindInvalid", name, err)
			}
		}
		// An old window without a bucket gets its tier's resolution.
		if _, err := h.Query(t.Context(), "svc1", dbcloud.SeriesQuery{Name: dbcloud.SeriesConnections, From: old, To: old.Add(time.Hour)}); err != nil {
			t.Errorf("old window with the default bucket: %v", err)
		}
	})
}
