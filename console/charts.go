package console

import (
	"context"
	"fmt"
	"strings"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

// chart is one metric of the last hour drawn as an inline SVG line:
// rendered on the server, so the page needs no charting script and stays
// within its Content-Security-Policy.
type chart struct {
	Title  string
	Latest string // the newest value, with its unit
	Points string // the polyline's points, in a chartWidth x chartHeight box
}

const (
	chartWidth  = 300
	chartHeight = 60
	chartWindow = time.Hour
)

// chartSeries are the metrics a service page draws, each with how to show
// its values.
var chartSeries = []struct {
	title, name string
	format      func(float64) string
}{
	{"CPU", dbcloud.SeriesCPUUsage, func(v float64) string { return fmt.Sprintf("%.0f millicores", v) }},
	{"Memory", dbcloud.SeriesMemoryUsage, megabytes},
	{"Storage", dbcloud.SeriesDiskUsage, megabytes},
	{"Connections", dbcloud.SeriesConnections, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
}

func megabytes(v float64) string { return fmt.Sprintf("%.0f MB", v/(1<<20)) }

// serviceCharts draws the service's metrics of the last hour, one point a
// minute, from the metrics history; none when the server keeps no history
// or has no samples yet.
func (h *Handler) serviceCharts(ctx context.Context, pid, sid string) []chart {
	now := h.cloud.Now()
	var charts []chart
	for _, cs := range chartSeries {
		res, err := h.cloud.MetricSeries(ctx, pid, sid, dbcloud.SeriesQuery{
			Name: cs.name, From: now.Add(-chartWindow), To: now, Bucket: time.Minute,
			Filters: []dbcloud.LabelFilter{{Key: "role", Value: "primary"}},
		})
		if err != nil || len(res) == 0 {
			continue
		}
		if c, ok := drawChart(cs.title, res[0].Points, cs.format); ok {
			charts = append(charts, c)
		}
	}
	return charts
}

// drawChart scales the points into the chart's box, from zero to the
// largest value; buckets without samples leave gaps in time, not in the
// line. It reports false for a series without any sample.
func drawChart(title string, points []dbcloud.SeriesPoint, format func(float64) string) (chart, bool) {
	var top float64
	var last *float64
	for _, p := range points {
		if p.Value != nil {
			top, last = max(top, *p.Value), p.Value
		}
	}
	if last == nil {
		return chart{}, false
	}
	if top == 0 {
		top = 1
	}
	var b strings.Builder
	n := max(1, len(points)-1)
	for i, p := range points {
		if p.Value == nil {
			continue
		}
		x := float64(i) * chartWidth / float64(n)
		y := chartHeight - *p.Value/top*(chartHeight-2) - 1
		fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
	}
	return chart{Title: title, Latest: format(*last), Points: strings.TrimSpace(b.String())}, true
}

// recentOperations lists the service's newest operations, for its page.
func (h *Handler) recentOperations(ctx context.Context, pid, sid string) ([]*dbcloud.Operation, error) {
	page, err := h.cloud.ListOperations(ctx, pid, cloud.OperationScope{ServiceID: sid}, "", 10)
	if err != nil {
		return nil, err
	}
	return page.Operations, nil
}
