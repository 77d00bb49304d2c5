package storetest

import (
	"fmt"
	"testing"
	"time"

	"dbcloud/history"

	"dbcloud"
)

func seriesStore(t *testing.T, newDB NewDB) dbcloud.SeriesStore {
	t.Helper()
	s, ok := MustOpen(t, newDB).(dbcloud.SeriesStore)
	if !ok {
		t.Fatal("store does not implement dbcloud.SeriesStore")
	}
	return s
}

// testSeries checks the merge, the range and order of a listing, and
// deletion by age.
func testSeries(t *testing.T, newDB NewDB) {
	s := seriesStore(t, newDB)
	ctx := t.Context()
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	row := func(labels string, res time.Duration, at time.Time, v float64) dbcloud.SeriesRow {
		return dbcloud.SeriesRow{ServiceID: "svc1", Name: "cpu", Labels: labels, Resolution: res, Bucket: at,
			Count: 1, Sum: v, First: v, Min: v, Max: v, Last: v}
	}
	if err := s.AddSeriesRows(ctx, []dbcloud.SeriesRow{
		row("role=primary", time.Minute, t0, 5),
		row("role=primary", time.Minute, t0, 2),
		row("role=primary", time.Minute, t0.Add(time.Minute), 7),
		row("role=replica", time.Minute, t0, 1),
		row("role=primary", time.Hour, t0, 5),
		{ServiceID: "svc2", Name: "cpu", Labels: "role=primary", Resolution: time.Minute, Bucket: t0, Count: 1, Sum: 9, First: 9, Min: 9, Max: 9, Last: 9},
		{ServiceID: "svc2", Name: "cpu", Labels: "role=primary", Resolution: time.Hour, Bucket: t0, Count: 1, Sum: 9, First: 9, Min: 9, Max: 9, Last: 9},
	}); err != nil {
		t.Fatalf("AddSeriesRows: %v", err)
	}
	// A second batch merges into what is stored.
	if err := s.AddSeriesRows(ctx, []dbcloud.SeriesRow{row("role=primary", time.Minute, t0, 4)}); err != nil {
		t.Fatalf("AddSeriesRows: %v", err)
	}
	got, err := s.ListSeriesRows(ctx, "svc1", "cpu", time.Minute, t0, t0.Add(time.Hour))
	if err != nil {
		t.Fatalf("ListSeriesRows: %v", err)
	}
	want := []string{
		"role=primary@12:00 n=3 sum=11 first=5 min=2 max=5 last=4",
		"role=primary@12:01 n=1 sum=7 first=7 min=7 max=7 last=7",
		"role=replica@12:00 n=1 sum=1 first=1 min=1 max=1 last=1",
	}
	if g := formatRows(got); fmt.Sprint(g) != fmt.Sprint(want) {
		t.Errorf("ListSeriesRows:\n got %q\nwant %q", g, want)
	}
	// to is exclusive, from inclusive.
	got, err = s.ListSeriesRows(ctx, "svc1", "cpu", time.Minute, t0.Add(time.Minute), t0.Add(2*time.Minute))
	if err != nil || len(got) != 1 || !got[0].Bucket.Equal(t0.Add(time.Minute)) {
		t.Errorf("ListSeriesRows [12:01, 12:02) = %v, %v; want the 12:01 row", formatRows(got), err)
	}
	got, err = s.ListSeriesRows(ctx, "svc1", "cpu", time.Minute, t0.Add(-time.Hour), t0)
	if err != nil || len(got) != 0 {
		t.Errorf("ListSeriesRows before t0 = %v, %v; want none", formatRows(got), err)
	}
	n, err := s.DeleteSeriesRowsBefore(ctx, time.Minute, t0.Add(time.Minute))
	if err != nil || n != 3 {
		t.Errorf("DeleteSeriesRowsBefore = %d, %v; want the 3 minute rows at 12:00 (svc1's two, svc2's)", n, err)
	}
	if c, err := s.CountSeriesRows(ctx); err != nil || c != 3 {
		t.Errorf("CountSeriesRows = %d, %v; want 3 (svc1's 12:01 minute and hour rows, svc2's hour row)", c, err)
	}
	n, err = s.DeleteSeries(ctx, "svc1")
	if err != nil || n != 2 {
		t.Errorf("DeleteSeries(svc1) = %d, %v; want its 2 rows", n, err)
	}
	if c, err := s.CountSeriesRows(ctx); err != nil || c != 1 {
		t.Errorf("CountSeriesRows after DeleteSeries = %d, %v; want svc2's row", c, err)
	}
}

func formatRows(rows []dbcloud.SeriesRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = fmt.Sprintf("%s@%s n=%d sum=%g first=%g min=%g max=%g last=%g", r.Labels, r.Bucket.Format("15:04"), r.Count, r.Sum, r.First, r.Min, r.Max, r.Last)
	}
	return out
}

// testSeriesBounded runs History over the store with a fast clock: four
// simulated days of samples every 30 seconds from two series, pruned as the
// engine prunes. The store never holds more than the tiers' retention over
// their resolution rows per series, and queries over each tier still
// answer.
func testSeriesBounded(t *testing.T, newDB NewDB) {
	s := seriesStore(t, newDB)
	ctx := t.Context()
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	// Shorter retentions than the defaults keep the test quick; the
	// arithmetic is the same.
	tiers := []dbcloud.SeriesTier{{Resolution: 0, Retention: time.Hour}, {Resolution: time.Minute, Retention: 3 * time.Hour}, {Resolution: time.Hour, Retention: 2 * 24 * time.Hour}}
	h := &history.Series{Store: s, Tiers: tiers, Now: func() time.Time { return now }}
	const step = 30 * time.Second
	const series = 2
	bound := 0
	for _, tr := range tiers {
		res := tr.Resolution
		if res == 0 {
			res = step
		}
		// +2: the bucket being filled and the one at the cut.
		bound += series * (int(tr.Retention/res) + 2)
	}
	start := now
	end := now.Add(4 * 24 * time.Hour)
	var batch []dbcloud.SeriesSample
	i := 0
	for ; now.Before(end); now = now.Add(step) {
		i++
		for k := range series {
			batch = append(batch, dbcloud.SeriesSample{ServiceID: "svc1", Name: dbcloud.SeriesConnections,
				Labels: map[string]string{"role": "primary", "ordinal": fmt.Sprint(k)}, Time: now, Value: float64(i % 100)})
		}
		// Batches of an hour keep the test fast; pruning every hour is what
		// bounds the store between prunes.
		if i%120 == 0 {
			if err := h.Record(ctx, batch); err != nil {
				t.Fatalf("Record: %v", err)
			}
			batch = batch[:0]
			if _, err := h.Prune(ctx); err != nil {
				t.Fatalf("Prune: %v", err)
			}
			c, err := s.CountSeriesRows(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if c > bound {
				t.Fatalf("after %s the store holds %d rows; the retention bounds it to %d", now.Sub(start), c, bound)
			}
		}
	}
	// The last hour at raw samples, the last 3 hours by minute, two days
	// by hour: each answers with data, one series per label set.
	for _, q := range []struct {
		from   time.Duration
		bucket time.Duration
	}{{30 * time.Minute, time.Minute}, {2 * time.Hour, 5 * time.Minute}, {36 * time.Hour, 6 * time.Hour}} {
		got, err := h.Query(ctx, "svc1", dbcloud.SeriesQuery{Name: dbcloud.SeriesConnections, From: now.Add(-q.from), To: now, Bucket: q.bucket})
		if err != nil {
			t.Fatalf("Query from %s ago: %v", q.from, err)
		}
		if len(got) != series || got[0].Points[0].Value == nil {
			t.Errorf("Query from %s ago: %d series, want %d with data", q.from, len(got), series)
		}
	}
	// Beyond the hour tier's retention there is nothing left.
	got, err := h.Query(ctx, "svc1", dbcloud.SeriesQuery{Name: dbcloud.SeriesConnections, From: now.Add(-4 * 24 * time.Hour), To: now.Add(-3 * 24 * time.Hour), Bucket: time.Hour})
	if err != nil || len(got) != 0 {
		t.Errorf("Query beyond retention = %d series, %v; want none", len(got), err)
	}
}
