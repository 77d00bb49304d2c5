package dbcloud

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Metric series a service has, named as the original's metrics preview
// names them where it has the same measurement (decisions.md section 1:
// its CLI and MCP tools ask for these names), and in the same scheme for
// the measurements dbcloud adds.
const (
	SeriesCPUUsage       = "timescale_cloud_system_cpu_usage_millicores"
	SeriesCPUTotal       = "timescale_cloud_system_cpu_total_millicores"
	SeriesMemoryUsage    = "timescale_cloud_system_memory_usage_bytes"
	SeriesMemoryTotal    = "timescale_cloud_system_memory_total_bytes"
	SeriesDiskUsage      = "timescale_cloud_system_disk_usage_bytes"
	SeriesConnections    = "timescale_cloud_database_num_connections"
	SeriesTransactions   = "timescale_cloud_database_transactions_per_second"
	SeriesWALBytes       = "timescale_cloud_database_wal_bytes_total"
	SeriesReplicationLag = "timescale_cloud_database_replication_lag_bytes"
	SeriesPoolerClients  = "timescale_cloud_pooler_client_connections"
	SeriesPoolerServers  = "timescale_cloud_pooler_server_connections"
)

// AvailableSeries lists every series name a service may have, sorted.
func AvailableSeries() []string {
	out := []string{
		SeriesCPUUsage, SeriesCPUTotal, SeriesMemoryUsage, SeriesMemoryTotal, SeriesDiskUsage,
		SeriesConnections, SeriesTransactions, SeriesWALBytes, SeriesReplicationLag,
		SeriesPoolerClients, SeriesPoolerServers,
	}
	slices.Sort(out)
	return out
}

// fnFixed are the series on which the original refuses an aggregation
// function (its openapi.yaml lists them); the same names behave the same
// here, so a script written against one works against the other.
var fnFixed = map[string]bool{
	SeriesCPUUsage: true, SeriesCPUTotal: true, SeriesMemoryUsage: true, SeriesMemoryTotal: true,
	SeriesDiskUsage: true, SeriesConnections: true,
}

// counterSeries only grow (until a restart resets them): RATE and INCREASE
// are meaningful on them and on nothing else.
var counterSeries = map[string]bool{SeriesWALBytes: true}

// DatabaseMetrics is what the runtime measured inside a service's primary
// and its pooler, beside the host usage of Metrics.
type DatabaseMetrics struct {
	// Connections counts client sessions, dbcloud's own excluded.
	Connections int64 `json:"connections"`
	// TransactionsPerSec is commits and rollbacks per second since the
	// previous sample (0 on the first).
	TransactionsPerSec float64 `json:"transactions_per_sec"`
	// WALBytes is the primary's WAL position in bytes: a counter.
	WALBytes int64 `json:"wal_bytes"`
	// Replication is the replay lag of every standby and read replica
	// node streaming from the primary.
	Replication []ReplicationLag `json:"replication,omitempty"`
	// PoolerClients and PoolerServers count the pooler's client and
	// server connections; nil without a pooler.
	PoolerClients *int64 `json:"pooler_clients,omitempty"`
	PoolerServers *int64 `json:"pooler_servers,omitempty"`
}

// ReplicationLag is how far one streaming node's replay is behind the
// primary's WAL position.
type ReplicationLag struct {
	// ReplicaSetID is empty for an HA standby of the service itself.
	ReplicaSetID string `json:"replica_set_id,omitempty"`
	// Ordinal is the node's number: the HA instance number or the read
	// replica set's node number.
	Ordinal  int   `json:"ordinal"`
	LagBytes int64 `json:"lag_bytes"`
}

// SeriesSample is one measurement of one labelled series of a service.
type SeriesSample struct {
	ServiceID string
	Name      string
	Labels    map[string]string
	Time      time.Time
	Value     float64
}

// Samples turns one measurement of a service into its series samples.
func Samples(svc *Service, m *Metrics) []SeriesSample {
	if m == nil {
		return nil
	}
	at := m.Measured
	primary := map[string]string{"role": "primary"}
	var out []SeriesSample
	add := func(name string, labels map[string]string, v float64) {
		out = append(out, SeriesSample{ServiceID: svc.ID, Name: name, Labels: labels, Time: at, Value: v})
	}
	add(SeriesCPUUsage, primary, float64(m.MilliCPU))
	add(SeriesMemoryUsage, primary, float64(m.MemoryMB<<20))
	add(SeriesDiskUsage, primary, float64(m.StorageMB<<20))
	if !svc.Spec.Size.Shared && svc.Spec.Size.CPUMillis > 0 {
		add(SeriesCPUTotal, primary, float64(svc.Spec.Size.CPUMillis))
		add(SeriesMemoryTotal, primary, float64(int64(svc.Spec.Size.MemoryGBs)<<30))
	}
	d := m.Database
	if d == nil {
		return out
	}
	add(SeriesConnections, primary, float64(d.Connections))
	add(SeriesTransactions, primary, d.TransactionsPerSec)
	add(SeriesWALBytes, primary, float64(d.WALBytes))
	for _, r := range d.Replication {
		labels := map[string]string{"role": "replica", "ordinal": fmt.Sprint(r.Ordinal)}
		if r.ReplicaSetID != "" {
			labels["replica_set_id"] = r.ReplicaSetID
		}
		add(SeriesReplicationLag, labels, float64(r.LagBytes))
	}
	if d.PoolerClients != nil {
		add(SeriesPoolerClients, primary, float64(*d.PoolerClients))
	}
	if d.PoolerServers != nil {
		add(SeriesPoolerServers, primary, float64(*d.PoolerServers))
	}
	return out
}

// SeriesRow is one stored aggregate: the samples of one labelled series
// that fell into one bucket of one resolution. Raw samples are rows of
// resolution 0 with Count 1.
type SeriesRow struct {
	ServiceID  string
	Name       string
	Labels     string // canonical, see formatLabels
	Resolution time.Duration
	Bucket     time.Time // start, whole seconds
	Count      int64
	Sum        float64
	First      float64
	Min        float64
	Max        float64
	Last       float64
}

// SeriesStore keeps series rows. It is apart from Tx because samples are
// written in batches of their own, never together with desired state.
type SeriesStore interface {
	// AddSeriesRows merges rows into the stored ones of the same key
	// (service, name, labels, resolution, bucket), in the order given:
	// counts and sums add, First stays, min and max combine, Last is
	// replaced.
	AddSeriesRows(ctx context.Context, rows []SeriesRow) error
	// ListSeriesRows returns a service's rows of one name and resolution
	// with from <= bucket < to, ordered by labels, then bucket.
	ListSeriesRows(ctx context.Context, serviceID, name string, res time.Duration, from, to time.Time) ([]SeriesRow, error)
	// DeleteSeriesRowsBefore deletes the rows of a resolution whose bucket
	// starts before before, and returns how many.
	DeleteSeriesRowsBefore(ctx context.Context, res time.Duration, before time.Time) (int, error)
	// DeleteSeries deletes every row of a service, and returns how many.
	DeleteSeries(ctx context.Context, serviceID string) (int, error)
	// CountSeriesRows returns how many rows are stored.
	CountSeriesRows(ctx context.Context) (int, error)
}

// SeriesTier is one resolution samples are kept at, and for how long.
type SeriesTier struct {
	Resolution time.Duration // 0: raw samples
	Retention  time.Duration
}

// DefaultSeriesTiers keep raw samples a day, minutes a week and hours
// ninety days: a week of detail for an incident, a season for a trend.
var DefaultSeriesTiers = []SeriesTier{
	{Resolution: 0, Retention: 24 * time.Hour},
	{Resolution: time.Minute, Retention: 7 * 24 * time.Hour},
	{Resolution: time.Hour, Retention: 90 * 24 * time.Hour},
}

// History records the metric samples of services and answers queries
// over them. Every sample is merged into each tier at once, so the
// coarse tiers are always current and rolling up needs no second pass;
// pruning by age then keeps the store bounded (tiers' retention over
// their resolution rows per series).
type History struct {
	Store SeriesStore
	// Tiers, finest first; DefaultSeriesTiers when empty.
	Tiers []SeriesTier
	// Now is injected so tests can run a fast clock.
	Now func() time.Time
}

func (h *History) tiers() []SeriesTier {
	if len(h.Tiers) == 0 {
		return DefaultSeriesTiers
	}
	return h.Tiers
}

func (h *History) now() time.Time {
	if h.Now == nil {
		return time.Now()
	}
	return h.Now()
}

// Record stores samples in every tier, in one batch.
func (h *History) Record(ctx context.Context, samples []SeriesSample) error {
	if len(samples) == 0 {
		return nil
	}
	rows := make([]SeriesRow, 0, len(samples)*len(h.tiers()))
	for _, s := range samples {
		labels := formatLabels(s.Labels)
		for _, t := range h.tiers() {
			rows = append(rows, SeriesRow{
				ServiceID: s.ServiceID, Name: s.Name, Labels: labels, Resolution: t.Resolution,
				Bucket: bucketStart(s.Time, t.Resolution), Count: 1, Sum: s.Value, First: s.Value, Min: s.Value, Max: s.Value, Last: s.Value,
			})
		}
	}
	return h.Store.AddSeriesRows(ctx, rows)
}

// Prune deletes what every tier holds beyond its retention, and returns
// how many rows it deleted.
func (h *History) Prune(ctx context.Context) (int, error) {
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
func (h *History) Forget(ctx context.Context, serviceID string) error {
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

// SeriesFn is how the samples of one output bucket become its value
// (the original's MetricsSeriesRequest fn).
type SeriesFn string

// Aggregation functions.
const (
	FnRate     SeriesFn = "RATE"
	FnIncrease SeriesFn = "INCREASE"
	FnSum      SeriesFn = "SUM"
	FnAvg      SeriesFn = "AVG"
	FnMin      SeriesFn = "MIN"
	FnMax      SeriesFn = "MAX"
	FnCount    SeriesFn = "COUNT"
	FnP50      SeriesFn = "P50"
	FnP90      SeriesFn = "P90"
	FnP99      SeriesFn = "P99"
	FnLast     SeriesFn = "LAST"
)

// SeriesQuery asks for one series over a window (the original's
// MetricsSeriesRequest).
type SeriesQuery struct {
	Name     string
	From, To time.Time
	// Bucket is the output bucket; 0 picks one from the window, and a
	// negative one is refused.
	Bucket  time.Duration
	Fn      SeriesFn // "" is LAST
	Filters []LabelFilter
}

// LabelFilter keeps series whose label Key equals Value.
type LabelFilter struct{ Key, Value string }

// SeriesPoint is one output bucket; Value is nil for a bucket without
// samples (gaps are emitted, not skipped, as the original does).
type SeriesPoint struct {
	Time  time.Time
	Value *float64
}

// SeriesResult is one labelled series of a query's answer.
type SeriesResult struct {
	Labels map[string]string
	Points []SeriesPoint
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
func (h *History) Query(ctx context.Context, serviceID string, q SeriesQuery) ([]SeriesResult, error) {
	if q.Name == "" {
		return nil, Errorf(KindInvalid, "name is required.")
	}
	if !slices.Contains(AvailableSeries(), q.Name) {
		return nil, Errorf(KindInvalid, "Unknown metric series %q; GET .../metrics/available-series lists them.", q.Name)
	}
	if q.From.IsZero() || q.To.IsZero() {
		return nil, Errorf(KindInvalid, "from and to are required.")
	}
	if !q.From.Before(q.To) {
		return nil, Errorf(KindInvalid, "from must be before to.")
	}
	if len(q.Filters) > maxSeriesFilters {
		return nil, Errorf(KindInvalid, "At most %d filters are allowed.", maxSeriesFilters)
	}
	for _, f := range q.Filters {
		if f.Key == "" || f.Value == "" {
			return nil, Errorf(KindInvalid, "Each filter needs a key and a value.")
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
		return nil, Errorf(KindInvalid, "The window holds more than %d buckets of %d seconds: widen bucket_seconds or narrow the window.",
			MaxSeriesBuckets, int64(bucket/time.Second))
	}
	n := int64((window + bucket - 1) / bucket)
	// A rate needs the sample before the window's first bucket.
	listFrom := from
	if fn == FnRate || fn == FnIncrease {
		listFrom = from.Add(-bucket)
	}
	rows, err := h.Store.ListSeriesRows(ctx, serviceID, q.Name, tier.Resolution, listFrom, q.To)
	if err != nil {
		return nil, err
	}
	var out []SeriesResult
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
		out = append(out, SeriesResult{Labels: labels, Points: aggregate(group, fn, from, bucket, int(n))})
	}
	sort.Slice(out, func(i, j int) bool { return formatLabels(out[i].Labels) < formatLabels(out[j].Labels) })
	if out == nil {
		out = []SeriesResult{}
	}
	return out, nil
}

func checkFn(name string, fn SeriesFn) (SeriesFn, error) {
	if fn == "" {
		return FnLast, nil
	}
	if fnFixed[name] {
		return "", Errorf(KindInvalid, "fn is not accepted on %s; omit it.", name)
	}
	switch fn {
	case FnSum, FnAvg, FnMin, FnMax, FnCount, FnLast:
		return fn, nil
	case FnRate, FnIncrease:
		if !counterSeries[name] {
			return "", Errorf(KindInvalid, "fn %s needs a counter; %s is a gauge (use AVG, MIN, MAX, SUM, COUNT or LAST).", fn, name)
		}
		return fn, nil
	case FnP50, FnP90, FnP99:
		return "", Errorf(KindInvalid, "fn %s is only valid for metrics stored as sketches; %s is not (use AVG, MIN, MAX, SUM, COUNT or LAST).", fn, name)
	}
	return "", Errorf(KindInvalid, "fn %q is not one of RATE, INCREASE, SUM, AVG, MIN, MAX, COUNT, P50, P90, P99, LAST.", fn)
}

// pickTier chooses the output bucket (the original's defaults when none is
// asked: a minute up to an hour's window, an hour up to 30 days, a day
// beyond) and the coarsest tier whose rows fit whole into it. The window
// must start inside that tier's retention, else a coarser bucket is asked
// for.
func (h *History) pickTier(q SeriesQuery) (SeriesTier, time.Duration, error) {
	tiers := h.tiers()
	now := h.now()
	bucket := q.Bucket
	if bucket < 0 {
		return SeriesTier{}, 0, errBucket()
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
		return SeriesTier{}, 0, errBucket()
	}
	var pick *SeriesTier
	for i := range tiers {
		t := &tiers[i]
		if t.Resolution == 0 || (t.Resolution <= bucket && bucket%t.Resolution == 0) {
			pick = t
		}
	}
	if pick == nil {
		return SeriesTier{}, 0, Errorf(KindInvalid, "bucket_seconds %d is finer than any stored resolution.", int64(bucket/time.Second))
	}
	if q.From.Before(now.Add(-pick.Retention)) {
		for _, t := range tiers {
			if t.Retention > pick.Retention && !q.From.Before(now.Add(-t.Retention)) {
				return SeriesTier{}, 0, Errorf(KindInvalid,
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
	return Errorf(KindInvalid, "bucket_seconds must be a whole number from %d to %d.",
		int64(MinSeriesBucket/time.Second), int64(MaxSeriesBucket/time.Second))
}

func matches(labels map[string]string, filters []LabelFilter) bool {
	for _, f := range filters {
		if !strings.EqualFold(labels[f.Key], f.Value) {
			return false
		}
	}
	return true
}

// aggregate folds one labelled series' rows (ordered by bucket) into n
// output buckets of width bucket from from.
func aggregate(rows []SeriesRow, fn SeriesFn, from time.Time, bucket time.Duration, n int) []SeriesPoint {
	type acc struct {
		count          int64
		sum, min, max  float64
		last, increase float64
	}
	accs := make([]*acc, n)
	var prev *SeriesRow
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
	out := make([]SeriesPoint, n)
	for k := range out {
		out[k].Time = from.Add(time.Duration(k) * bucket)
		a := accs[k]
		if a == nil {
			continue
		}
		var v float64
		switch fn {
		case FnSum:
			v = a.sum
		case FnAvg:
			v = a.sum / float64(a.count)
		case FnMin:
			v = a.min
		case FnMax:
			v = a.max
		case FnCount:
			v = float64(a.count)
		case FnIncrease:
			v = a.increase
		case FnRate:
			v = a.increase / bucket.Seconds()
		default:
			v = a.last
		}
		out[k].Value = &v
	}
	return out
}
