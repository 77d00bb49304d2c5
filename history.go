package dbcloud

import (
	"context"
	"fmt"
	"slices"
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
