package http

import (
	"net/http"
	"strings"
	"time"

	"dbcloud/history"

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
	// Every check is the domain's, after it has found the caller's
	// service: another project's service is a 404 whatever the body.
	q := dbcloud.SeriesQuery{Name: str(in.Name), Fn: dbcloud.SeriesFn(strings.ToUpper(str(in.Fn)))}
	if in.From != nil {
		q.From = *in.From
	}
	if in.To != nil {
		q.To = *in.To
	}
	if b := in.BucketSeconds; b != nil {
		// Out of range is -1, which the domain refuses: never the default
		// (0), nor a Duration that overflowed.
		q.Bucket = -1
		if *b > 0 && int64(*b) <= int64(history.MaxSeriesBucket/time.Second) {
			q.Bucket = time.Duration(*b) * time.Second
		}
	}
	for _, f := range in.Filters {
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
