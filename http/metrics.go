package http

import (
	"net/http"
	"strings"
	"time"

	"dbcloud"
)

// The metrics preview the original's CLI and MCP server call (decisions.md
// section 1), with the original's request and response shapes.

type metricsSeriesRequest struct {
	Name          *string             `json:"name"`
	From          *time.Time          `json:"from"`
	To            *time.Time          `json:"to"`
	BucketSeconds *int                `json:"bucket_seconds"`
	Fn            *string             `json:"fn"`
	Filters       []metricLabelFilter `json:"filters"`
}

type metricLabelFilter struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type metricSeriesJSON struct {
	Labels map[string]string `json:"labels"`
	Data   []metricDataPoint `json:"data"`
}

// metricDataPoint's value is null, not omitted, in a gap bucket.
type metricDataPoint struct {
	Time  time.Time `json:"time"`
	Value *float64  `json:"value"`
}

func (h *Handler) metricsAvailableSeries(w http.ResponseWriter, r *http.Request) (int, any, error) {
	names, err := h.cloud.AvailableMetricSeries(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, names, nil
}

func (h *Handler) metricsSeries(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in metricsSeriesRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("name", in.Name); err != nil {
		return 0, nil, err
	}
	if in.From == nil || in.To == nil {
		return 0, nil, dbcloud.Errorf(dbcloud.KindInvalid, "from and to are required.")
	}
	q := dbcloud.SeriesQuery{Name: *in.Name, From: *in.From, To: *in.To, Fn: dbcloud.SeriesFn(strings.ToUpper(str(in.Fn)))}
	if in.BucketSeconds != nil {
		if *in.BucketSeconds < 60 {
			return 0, nil, dbcloud.Errorf(dbcloud.KindInvalid, "bucket_seconds must be at least 60, got %d.", *in.BucketSeconds)
		}
		q.Bucket = time.Duration(*in.BucketSeconds) * time.Second
	}
	for _, f := range in.Filters {
		if f.Key == "" || f.Value == "" {
			return 0, nil, dbcloud.Errorf(dbcloud.KindInvalid, "Each filter needs a key and a value.")
		}
		q.Filters = append(q.Filters, dbcloud.LabelFilter{Key: f.Key, Value: f.Value})
	}
	series, err := h.cloud.MetricSeries(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), q)
	if err != nil {
		return 0, nil, err
	}
	out := make([]metricSeriesJSON, len(series))
	for i, s := range series {
		out[i] = metricSeriesJSON{Labels: s.Labels, Data: make([]metricDataPoint, len(s.Points))}
		for j, p := range s.Points {
			out[i].Data[j] = metricDataPoint{Time: p.Time.UTC(), Value: p.Value}
		}
	}
	return http.StatusOK, out, nil
}
