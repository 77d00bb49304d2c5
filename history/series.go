package history

import (
	"context"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"dbcloud"
)

// fnFixed are the series on which the original refuses an aggregation
// function (its openapi.yaml lists them); the same names behave the same
// here, so a script written against one works against the other.
var fnFixed = map[string]bool{
	dbcloud.SeriesCPUUsage: true, dbcloud.SeriesCPUTotal: true, dbcloud.SeriesMemoryUsage: true, dbcloud.SeriesMemoryTotal: true,
	dbcloud.SeriesDiskUsage: true, dbcloud.SeriesConnections: true,
}

// counterSeries only grow (until a restart resets them): RATE and INCREASE
// are meaningful on them and on nothing else.
var counterSeries = map[string]bool{dbcloud.SeriesWALBytes: true}

// Series records the metric samples of services and answers queries
// over them. Every sample is merged into each tier at once, so the
// coarse tiers are always current and rolling up needs no second pass;
// pruning by age then keeps the store bounded (tiers' retention over
// their resolution rows per series).
type Series struct {
	Store dbcloud.SeriesStore
	// Tiers, finest first; DefaultSeriesTiers when empty.
	Tiers []dbcloud.SeriesTier
	// Now is injected so tests can run a fast clock.
	Now func() time.Time
}

func (h *Series) tiers() []dbcloud.SeriesTier {
	if len(h.Tiers) == 0 {
		return dbcloud.DefaultSeriesTiers
	}
	return h.Tiers
}

func (h *Series) now() time.Time {
	if h.Now == nil {
		return time.Now()
	}
	return h.Now()
}

// Record stores samples in every tier, in one batch.
func (h *Series) Record(ctx context.Context, samples []dbcloud.SeriesSample) error {
	if len(samples) == 0 {
		return nil
	}
	rows := make([]dbcloud.SeriesRow, 0, len(samples)*len(h.tiers()))
	for _, s := range samples {
		labels := formatLabels(s.Labels)
		for _, t := range h.tiers() {
			rows = append(rows, dbcloud.SeriesRow{
				ServiceID: s.ServiceID, Name: s.Name, Labels: labels, Resolution: t.Resolution,
				Bucket: bucketStart(s.Time, t.Resolution), Count: 1, Sum: s.Value, First: s.Value, Min: s.Value, Max: s.Value, Last: s.Value,
			})
		}
	}
	return h.Store.AddSeriesRows(ctx, rows)
}

// Prune deletes what every tier holds beyond its retention, and returns
// how many rows it deleted.
func (h *Series) Prune(ctx context.Context) (int, error) {
	total := 0
	now := h.now()
	for _, t := range h.tiers() {
		n, err := h.Store.DeleteSeriesRowsBefore(ctx, t.Resolution, now.Add(-t.Retention))
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// Forget deletes a deleted service's history at once, rather than at the
// end of the longest retention.
func (h *Series) Forget(ctx context.Context, serviceID string) error {
	_, err := h.Store.DeleteSeries(ctx, serviceID)
	return err
}

// bucketStart is the start of the bucket of resolution res holding t;
// raw samples keep their second.
func bucketStart(t time.Time, res time.Duration) time.Time {
	if res < time.Second {
		return t.UTC().Truncate(time.Second)
	}
	s := res.Nanoseconds() / int64(time.Second)
	u := t.Unix()
	return time.Unix(u-mod(u, s), 0).UTC()
}

func mod(a, b int64) int64 { return ((a % b) + b) % b }

// formatLabels is the stored form of a label set: key=value pairs sorted
// by key and joined by commas. Keys and values are dbcloud's own (roles,
// ordinals, IDs), never a tenant's text, so no escaping is needed.
func formatLabels(l map[string]string) string {
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}

func parseLabels(s string) map[string]string {
	out := map[string]string{}
	if s == "" {
		return out
	}
	for _, p := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(p, "=")
		out[k] = v
	}
	return out
}

// Limits of a query.
const (
	MinSeriesBucket   = time.Minute
	MaxSeriesBucket   = 366 * 24 * time.Hour
	MaxSeriesBuckets  = 10000
	maxSeriesFilters  = 20
	defaultFineWindow = time.Hour
	defaultMidWindow  = 30 * 24 * time.Hour
)

// Query answers a query for one service from the finest tier that can
// produce its buckets exactly.
func (h *Series) Query(ctx context.Context, serviceID string, q dbcloud.SeriesQuery) ([]dbcloud.SeriesResult, error) {
	if q.Name == "" {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "name is required.")
	}
	if !slices.Contains(dbcloud.AvailableSeries(), q.Name) {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "Unknown metric series %q; GET .../metrics/available-series lists them.", q.Name)
	}
	if q.From.IsZero() || q.To.IsZero() {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "from and to are required.")
	}
	if !q.From.Before(q.To) {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "from must be before to.")
	}
	if len(q.Filters) > maxSeriesFilters {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "At most %d filters are allowed.", maxSeriesFilters)
	}
	for _, f := range q.Filters {
		if f.Key == "" || f.Value == "" {
			return nil, dbcloud.Errorf(dbcloud.KindInvalid, "Each filter needs a key and a value.")
		}
	}
	fn, err := checkFn(q.Name, q.Fn)
	if err != nil {
		return nil, err
	}
	tier, bucket, err := h.pickTier(q)
	if err != nil {
		return nil, err
	}
	from := bucketStart(q.From, bucket)
	// Sub saturates, and bucket is at most MaxSeriesBucket: no overflow.
	window := q.To.Sub(from)
	if window/bucket >= MaxSeriesBuckets {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "The window holds more than %d buckets of %d seconds: widen bucket_seconds or narrow the window.",
			MaxSeriesBuckets, int64(bucket/time.Second))
	}
	n := int64((window + bucket - 1) / bucket)
	// A rate needs the sample before the window's first bucket.
	listFrom := from
	if fn == dbcloud.FnRate || fn == dbcloud.FnIncrease {
		listFrom = from.Add(-bucket)
	}
	rows, err := h.Store.ListSeriesRows(ctx, serviceID, q.Name, tier.Resolution, listFrom, q.To)
	if err != nil {
		return nil, err
	}
	var out []dbcloud.SeriesResult
	for len(rows) > 0 {
		i := 1
		for i < len(rows) && rows[i].Labels == rows[0].Labels {
			i++
		}
		group := rows[:i]
		rows = rows[i:]
		labels := parseLabels(group[0].Labels)
		if !matches(labels, q.Filters) {
			continue
		}
		out = append(out, dbcloud.SeriesResult{Labels: labels, Points: aggregate(group, fn, from, bucket, int(n))})
	}
	sort.Slice(out, func(i, j int) bool { return formatLabels(out[i].Labels) < formatLabels(out[j].Labels) })
	if out == nil {
		out = []dbcloud.SeriesResult{}
	}
	return out, nil
}

func checkFn(name string, fn dbcloud.SeriesFn) (dbcloud.SeriesFn, error) {
	if fn == "" {
		return dbcloud.FnLast, nil
	}
	if fnFixed[name] {
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "fn is not accepted on %s; omit it.", name)
	}
	switch fn {
	case dbcloud.FnSum, dbcloud.FnAvg, dbcloud.FnMin, dbcloud.FnMax, dbcloud.FnCount, dbcloud.FnLast:
		return fn, nil
	case dbcloud.FnRate, dbcloud.FnIncrease:
		if !counterSeries[name] {
			return "", dbcloud.Errorf(dbcloud.KindInvalid, "fn %s needs a counter; %s is a gauge (use AVG, MIN, MAX, SUM, COUNT or LAST).", fn, name)
		}
		return fn, nil
	case dbcloud.FnP50, dbcloud.FnP90, dbcloud.FnP99:
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "fn %s is only valid for metrics stored as sketches; %s is not (use AVG, MIN, MAX, SUM, COUNT or LAST).", fn, name)
	}
	return "", dbcloud.Errorf(dbcloud.KindInvalid, "fn %q is not one of RATE, INCREASE, SUM, AVG, MIN, MAX, COUNT, P50, P90, P99, LAST.", fn)
}

// pickTier chooses the output bucket (the original's defaults when none is
// asked: a minute up to an hour's window, an hour up to 30 days, a day
// beyond) and the coarsest tier whose rows fit whole into it. The window
// must start inside that tier's retention, else a coarser bucket is asked
// for.
func (h *Series) pickTier(q dbcloud.SeriesQuery) (dbcloud.SeriesTier, time.Duration, error) {
	tiers := h.tiers()
	now := h.now()
	bucket := q.Bucket
	if bucket < 0 {
		return dbcloud.SeriesTier{}, 0, errBucket()
	}
	if bucket == 0 {
		switch w := q.To.Sub(q.From); {
		case w <= defaultFineWindow:
			bucket = time.Minute
		case w <= defaultMidWindow:
			bucket = time.Hour
		default:
			bucket = 24 * time.Hour
		}
		// An old window gets the finest bucket its tier has.
		for _, t := range tiers {
			if !q.From.Before(now.Add(-t.Retention)) {
				bucket = max(bucket, t.Resolution)
				break
			}
		}
	}
	if bucket < MinSeriesBucket || bucket > MaxSeriesBucket || bucket%time.Second != 0 {
		return dbcloud.SeriesTier{}, 0, errBucket()
	}
	var pick *dbcloud.SeriesTier
	for i := range tiers {
		t := &tiers[i]
		if t.Resolution == 0 || (t.Resolution <= bucket && bucket%t.Resolution == 0) {
			pick = t
		}
	}
	if pick == nil {
		return dbcloud.SeriesTier{}, 0, dbcloud.Errorf(dbcloud.KindInvalid, "bucket_seconds %d is finer than any stored resolution.", int64(bucket/time.Second))
	}
	if q.From.Before(now.Add(-pick.Retention)) {
		for _, t := range tiers {
			if t.Retention > pick.Retention && !q.From.Before(now.Add(-t.Retention)) {
				return dbcloud.SeriesTier{}, 0, dbcloud.Errorf(dbcloud.KindInvalid,
					"A window starting before %s is kept at %d-second resolution only: bucket_seconds must be a multiple of %d.",
					now.Add(-pick.Retention).UTC().Format(time.RFC3339), int64(t.Resolution/time.Second), int64(t.Resolution/time.Second))
			}
		}
	}
	return *pick, bucket, nil
}

func growth(from, to float64) float64 {
	if to < from {
		return to
	}
	return to - from
}

func errBucket() error {
	return dbcloud.Errorf(dbcloud.KindInvalid, "bucket_seconds must be a whole number from %d to %d.",
		int64(MinSeriesBucket/time.Second), int64(MaxSeriesBucket/time.Second))
}

func matches(labels map[string]string, filters []dbcloud.LabelFilter) bool {
	for _, f := range filters {
		if !strings.EqualFold(labels[f.Key], f.Value) {
			return false
		}
	}
	return true
}

// aggregate folds one labelled series' rows (ordered by bucket) into n
// output buckets of width bucket from from.
func aggregate(rows []dbcloud.SeriesRow, fn dbcloud.SeriesFn, from time.Time, bucket time.Duration, n int) []dbcloud.SeriesPoint {
	type acc struct {
		count          int64
		sum, min, max  float64
		last, increase float64
	}
	accs := make([]*acc, n)
	var prev *dbcloud.SeriesRow
	for i := range rows {
		r := &rows[i]
		// A counter's growth: from the previous row's last value to this
		// row's first, then within the row. A drop is a restart from 0.
		delta := growth(r.First, r.Last)
		if prev != nil {
			delta += growth(prev.Last, r.First)
		}
		prev = r
		k := int(r.Bucket.Sub(from) / bucket)
		if r.Bucket.Before(from) || k >= n {
			continue
		}
		a := accs[k]
		if a == nil {
			a = &acc{min: math.Inf(1), max: math.Inf(-1)}
			accs[k] = a
		}
		a.count += r.Count
		a.sum += r.Sum
		a.min = math.Min(a.min, r.Min)
		a.max = math.Max(a.max, r.Max)
		a.last = r.Last
		a.increase += delta
	}
	out := make([]dbcloud.SeriesPoint, n)
	for k := range out {
		out[k].Time = from.Add(time.Duration(k) * bucket)
		a := accs[k]
		if a == nil {
			continue
		}
		var v float64
		switch fn {
		case dbcloud.FnSum:
			v = a.sum
		case dbcloud.FnAvg:
			v = a.sum / float64(a.count)
		case dbcloud.FnMin:
			v = a.min
		case dbcloud.FnMax:
			v = a.max
		case dbcloud.FnCount:
			v = float64(a.count)
		case dbcloud.FnIncrease:
			v = a.increase
		case dbcloud.FnRate:
			v = a.increase / bucket.Seconds()
		default:
			v = a.last
		}
		out[k].Value = &v
	}
	return out
}
