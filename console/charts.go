package console

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

// chart is one metric over the chosen range drawn as an inline SVG with a
// time axis and a value axis: rendered on the server, so the page needs no
// charting script and stays within its Content-Security-Policy. Each
// point carries its time and value as an SVG title, which browsers show on
// hover.
type chart struct {
	Title  string
	Latest string // the newest value, with its unit; "" when not current
	Points string // the polyline's points, in the chart's viewBox
	Dots   []chartDot
	XTicks []chartTick
	YTicks []chartTick
}

type chartDot struct {
	X, Y  float64
	Label string
}

type chartTick struct {
	X, Y  float64
	Label string
}

// The chart's box (its viewBox) and the plot area inside it: the left
// margin holds the value labels, the bottom one the time labels.
const (
	chartWidth  = 600
	chartHeight = 170
	plotLeft    = 70
	plotRight   = chartWidth - 8
	plotTop     = 8
	plotBottom  = chartHeight - 22
)

// chartRange is one of the ranges a service page offers, with the bucket
// that gives it about sixty to ninety points and how its time labels read.
type chartRange struct {
	Name   string
	Window time.Duration
	Bucket time.Duration
	Layout string
}

var chartRanges = []chartRange{
	{"1h", time.Hour, time.Minute, "15:04"},
	{"6h", 6 * time.Hour, 5 * time.Minute, "15:04"},
	{"24h", 24 * time.Hour, 20 * time.Minute, "15:04"},
	{"7d", 7 * 24 * time.Hour, 2 * time.Hour, "Jan 2"},
}

// rangeOf is the range a page's query names, the first one by default.
func rangeOf(name string) chartRange {
	for _, r := range chartRanges {
		if r.Name == name {
			return r
		}
	}
	return chartRanges[0]
}

// chartSeries are the metrics a service page draws, each with how its
// buckets are summed up and how to show its values. The system series and
// connections take no fn (the history keeps their last value per bucket,
// as the original does); transactions and pooler clients are averaged,
// WAL is a counter drawn as its rate, and lag shows each bucket's worst.
var chartSeries = []struct {
	title, name string
	fn          dbcloud.SeriesFn
	role        string
	format      func(float64) string
}{
	{"CPU", dbcloud.SeriesCPUUsage, "", "primary", func(v float64) string { return fmt.Sprintf("%.0f millicores", v) }},
	{"Memory", dbcloud.SeriesMemoryUsage, "", "primary", megabytes},
	{"Storage", dbcloud.SeriesDiskUsage, "", "primary", megabytes},
	{"Connections", dbcloud.SeriesConnections, "", "primary", count},
	{"Transactions/s", dbcloud.SeriesTransactions, dbcloud.FnAvg, "primary", func(v float64) string { return fmt.Sprintf("%.1f/s", v) }},
	{"WAL written", dbcloud.SeriesWALBytes, dbcloud.FnRate, "primary", func(v float64) string { return fmt.Sprintf("%.1f kB/s", v/1024) }},
	{"Pooler clients", dbcloud.SeriesPoolerClients, dbcloud.FnAvg, "primary", count},
	{"Replication lag", dbcloud.SeriesReplicationLag, dbcloud.FnMax, "replica", func(v float64) string { return fmt.Sprintf("%.0f kB", v/1024) }},
}

func megabytes(v float64) string { return fmt.Sprintf("%.0f MB", v/(1<<20)) }

func count(v float64) string { return fmt.Sprintf("%.0f", v) }

// serviceCharts draws the service's metrics over the range from the
// metrics history; none when the server keeps no history or has no
// samples yet. A series per node (replication lag) gets a chart per node.
// A service that is not running shows no value as current.
func (h *Handler) serviceCharts(ctx context.Context, pid string, s *dbcloud.Service, rg chartRange) []chart {
	now := h.cloud.Now()
	var charts []chart
	for _, cs := range chartSeries {
		res, err := h.cloud.MetricSeries(ctx, pid, s.ID, dbcloud.SeriesQuery{
			Name: cs.name, From: now.Add(-rg.Window), To: now, Bucket: rg.Bucket, Fn: cs.fn,
			Filters: []dbcloud.LabelFilter{{Key: "role", Value: cs.role}},
		})
		if err != nil {
			continue
		}
		sort.Slice(res, func(i, j int) bool { return nodeName(res[i].Labels) < nodeName(res[j].Labels) })
		for _, sr := range res {
			title := cs.title
			if cs.role == "replica" {
				title += ", " + nodeName(sr.Labels)
			}
			c, ok := drawChart(title, sr.Points, cs.format, rg)
			if !ok {
				continue
			}
			if !s.Spec.Running || s.Status == dbcloud.StatusPaused {
				c.Latest = ""
			}
			charts = append(charts, c)
		}
	}
	return charts
}

// nodeName names the node a replication series measures.
func nodeName(l map[string]string) string {
	if rs := l["replica_set_id"]; rs != "" {
		return "read replica " + rs + " node " + l["ordinal"]
	}
	return "standby " + l["ordinal"]
}

// drawChart scales the points into the plot, from zero to the largest
// value; buckets without samples leave gaps in time, not in the line. It
// reports false for a series without any sample.
func drawChart(title string, points []dbcloud.SeriesPoint, format func(float64) string, rg chartRange) (chart, bool) {
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
	c := chart{Title: title, Latest: format(*last)}
	n := max(1, len(points)-1)
	xOf := func(i int) float64 { return plotLeft + float64(i)*(plotRight-plotLeft)/float64(n) }
	var b strings.Builder
	for i, p := range points {
		if p.Value == nil {
			continue
		}
		x, y := xOf(i), plotBottom-*p.Value/top*(plotBottom-plotTop)
		fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		c.Dots = append(c.Dots, chartDot{X: x, Y: y, Label: p.Time.UTC().Format("2006-01-02 15:04 UTC") + ": " + format(*p.Value)})
	}
	c.Points = strings.TrimSpace(b.String())
	// Five time labels, first to last bucket; three value labels.
	for k := 0; k <= 4; k++ {
		i := k * (len(points) - 1) / 4
		c.XTicks = append(c.XTicks, chartTick{X: xOf(i), Y: chartHeight - 6, Label: points[i].Time.UTC().Format(rg.Layout)})
	}
	for k := 0; k <= 2; k++ {
		v := top * float64(k) / 2
		c.YTicks = append(c.YTicks, chartTick{X: plotLeft - 6, Y: plotBottom - v/top*(plotBottom-plotTop), Label: format(v)})
	}
	return c, true
}

// recentOperations lists the service's newest operations, for its page.
func (h *Handler) recentOperations(ctx context.Context, pid, sid string) ([]*dbcloud.Operation, error) {
	page, err := h.cloud.ListOperations(ctx, pid, cloud.OperationScope{ServiceID: sid}, "", 10)
	if err != nil {
		return nil, err
	}
	return page.Operations, nil
}
