package http_test

import (
	"testing"
	"time"

	"dbcloud"
)

// TestMetricsPreview: the original CLI's two metrics calls, in its request
// shapes, answered from recorded samples.
func TestMetricsPreview(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		var created service
		e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "m"}}).decode(t, &created)
		path := e.pa() + "/services/" + created.ServiceID + "/metrics"
		now := time.Now().UTC().Truncate(time.Minute)
		var samples []dbcloud.SeriesSample
		for i := range 3 {
			samples = append(samples, dbcloud.Samples(&dbcloud.Service{ID: created.ServiceID},
				&dbcloud.Metrics{MilliCPU: int64(100 * (i + 1)), Measured: now.Add(time.Duration(i-2) * time.Minute),
					Database: &dbcloud.DatabaseMetrics{Connections: 3}})...)
		}
		if err := e.cloud.History.Record(t.Context(), samples); err != nil {
			t.Fatal(err)
		}

		var names []string
		e.want(200, "", req{Method: "GET", Path: path + "/available-series"}).decode(t, &names)
		if len(names) != len(dbcloud.AvailableSeries()) || names[0] == "" {
			t.Errorf("available-series = %v, want %v", names, dbcloud.AvailableSeries())
		}

		var got []struct {
			Labels map[string]string
			Data   []struct {
				Time  time.Time
				Value *float64
			}
		}
		body := map[string]any{
			"name": dbcloud.SeriesCPUUsage, "from": now.Add(-4 * time.Minute).Format(time.RFC3339), "to": now.Add(time.Minute).Format(time.RFC3339),
			"filters": []map[string]string{{"key": "role", "value": "primary"}},
		}
		e.want(200, "", req{Method: "POST", Path: path + "/series", Body: body}).decode(t, &got)
		if len(got) != 1 || got[0].Labels["role"] != "primary" || len(got[0].Data) != 5 {
			t.Fatalf("series = %+v, want one primary series of 5 minute buckets", got)
		}
		if got[0].Data[0].Value != nil || got[0].Data[4].Value == nil || *got[0].Data[4].Value != 300 {
			t.Errorf("series data = %+v, want null first, 300 last", got[0].Data)
		}

		bad := func(change map[string]any) map[string]any {
			b := map[string]any{"name": dbcloud.SeriesConnections, "from": body["from"], "to": body["to"]}
			for k, v := range change {
				b[k] = v
			}
			return b
		}
		for _, b := range []map[string]any{
			bad(map[string]any{"name": "nope"}),
			bad(map[string]any{"from": "yesterday"}),
			bad(map[string]any{"to": nil}),
			bad(map[string]any{"bucket_seconds": 30}),
			bad(map[string]any{"bucket_seconds": 0}),
			bad(map[string]any{"bucket_seconds": int64(1) << 62}),
			bad(map[string]any{"from": "0001-01-02T00:00:00Z", "to": "9999-01-01T00:00:00Z"}),
			bad(map[string]any{"fn": "AVG"}),
			bad(map[string]any{"filters": []map[string]string{{"key": "role"}}}),
		} {
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path + "/series", Body: b})
		}
		other := e.pa() + "/services/abcdefghij/metrics"
		e.want(404, "NOT_FOUND", req{Method: "GET", Path: other + "/available-series"})
		e.want(404, "NOT_FOUND", req{Method: "POST", Path: other + "/series", Body: body})
		e.want(404, "NOT_FOUND", req{Method: "GET", Path: path + "/available-series", Key: e.b})
	})
}
