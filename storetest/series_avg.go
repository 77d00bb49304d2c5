package storetest

import (
	"fmt"
	"testing"
	"time"

	"dbcloud/history"

	"dbcloud"
)

// testSeriesAvg reads AVG back through History from the minute and hour
// tiers of a series whose values are not all zero, with one minute's
// samples arriving in two batches: an average is the merged sum over the
// merged count, so a store that loses either across batches, or a query
// that answers the sum, gives another number.
func testSeriesAvg(t *testing.T, newDB NewDB) {
	s := seriesStore(t, newDB)
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	now := t0.Add(10 * time.Minute)
	h := &history.Series{Store: s, Now: func() time.Time { return now }}
	sample := func(sec int, v float64) dbcloud.SeriesSample {
		return dbcloud.SeriesSample{ServiceID: "svc1", Name: dbcloud.SeriesTransactions,
			Labels: map[string]string{"role": "primary"}, Time: t0.Add(time.Duration(sec) * time.Second), Value: v}
	}
	for _, batch := range [][]dbcloud.SeriesSample{
		{sample(0, 10), sample(20, 20), sample(60, 5), sample(90, 7)},
		// The rest of minute 12:00, recorded by a later round.
		{sample(40, 60)},
	} {
		if err := h.Record(t.Context(), batch); err != nil {
			t.Fatalf("Record: %v", err)
		}
	}
	for _, tt := range []struct {
		what   string
		bucket time.Duration
		to     time.Time
		fn     dbcloud.SeriesFn
		want   string
	}{
		{"minute AVG", time.Minute, t0.Add(2 * time.Minute), dbcloud.FnAvg, " 30 6"}, // (10+20+60)/3, (5+7)/2
		{"minute COUNT", time.Minute, t0.Add(2 * time.Minute), dbcloud.FnCount, " 3 2"},
		{"minute SUM", time.Minute, t0.Add(2 * time.Minute), dbcloud.FnSum, " 90 12"},
		{"hour AVG", time.Hour, t0.Add(time.Hour), dbcloud.FnAvg, " 20.4"}, // 102/5
		{"hour SUM", time.Hour, t0.Add(time.Hour), dbcloud.FnSum, " 102"},
	} {
		got, err := h.Query(t.Context(), "svc1", dbcloud.SeriesQuery{Name: dbcloud.SeriesTransactions,
			From: t0, To: tt.to, Bucket: tt.bucket, Fn: tt.fn})
		if err != nil {
			t.Fatalf("%s: %v", tt.what, err)
		}
		if len(got) != 1 {
			t.Errorf("%s: %d series, want 1", tt.what, len(got))
			continue
		}
		if v := pointValues(got[0].Points); v != tt.want {
			t.Errorf("%s = %s, want %s", tt.what, v, tt.want)
		}
	}
}

// pointValues shows a series' points as " v1 v2 ...", null for a gap.
func pointValues(points []dbcloud.SeriesPoint) string {
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
