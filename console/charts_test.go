package console_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"dbcloud"
)

// TestConsoleChartRanges: the service page's charts cover the range its
// query names (1h by default, 6h, 24h, 7d), with time labels along the
// axis and each sample's time and value as its hover title; a stopped
// service shows no value as current.
func TestConsoleChartRanges(t *testing.T) {
	s, b, page := signedIn(t)
	base := s.srv.URL + "/p/" + s.boot.Project.ID
	b.post(base+"/services", url.Values{"csrf": {csrfOf(t, page)}, "name": {"ranged"}, "size": {"500/2"}})
	sid := listServices(t, s)[0].Service.ID
	settle(t, s, sid, dbcloud.StatusReady)

	// One CPU sample in each range only the wider ranges reach.
	now := s.clock().UTC().Truncate(time.Minute)
	at := map[float64]time.Time{111: now.Add(-30 * time.Minute), 222: now.Add(-5 * time.Hour), 333: now.Add(-20 * time.Hour), 444: now.Add(-5 * 24 * time.Hour)}
	var samples []dbcloud.SeriesSample
	for v, when := range at {
		samples = append(samples, dbcloud.SeriesSample{ServiceID: sid, Name: dbcloud.SeriesCPUUsage,
			Labels: map[string]string{"role": "primary"}, Time: when, Value: v})
	}
	if err := s.cloud.History.Record(context.Background(), samples); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		query    string
		shown    []float64
		hidden   []float64
		label    string
		selected string
	}{
		{"", []float64{111}, []float64{222, 333, 444}, axisStart(s.clock(), time.Hour, time.Minute, "15:04"), "1h"},
		{"?range=6h", []float64{111, 222}, []float64{333, 444}, axisStart(s.clock(), 6*time.Hour, 5*time.Minute, "15:04"), "6h"},
		{"?range=24h", []float64{111, 222, 333}, []float64{444}, axisStart(s.clock(), 24*time.Hour, 20*time.Minute, "15:04"), "24h"},
		{"?range=7d", []float64{111, 222, 333, 444}, nil, axisStart(s.clock(), 7*24*time.Hour, 2*time.Hour, "Jan 2"), "7d"},
	} {
		_, page := b.get(base + "/services/" + sid + c.query)
		if !strings.Contains(page, `?range=`+c.selected+`" aria-current="true"`) {
			t.Errorf("%q: range %s not marked as chosen", c.query, c.selected)
		}
		for _, v := range c.shown {
			// A point is titled with its bucket's start: a sample's own
			// minute in the 1h range.
			label := fmt.Sprintf(" UTC: %.0f millicores</title>", v)
			if c.selected == "1h" {
				label = "<title>" + at[v].Format("2006-01-02 15:04") + label
			}
			if !strings.Contains(page, label) {
				t.Errorf("%q: no point %q", c.query, label)
			}
		}
		for _, v := range c.hidden {
			if strings.Contains(page, fmt.Sprintf(": %.0f millicores", v)+"</title>") {
				t.Errorf("%q: the sample %v outside the range is drawn", c.query, v)
			}
		}
		if c.label != "" && !strings.Contains(page, ">"+c.label+"</text>") {
			t.Errorf("%q: no time label %q on the axis", c.query, c.label)
		}
	}

	// Stopped: the chart stays, but nothing is "now".
	_, page = b.get(base + "/services/" + sid)
	b.post(base+"/services/"+sid+"/stop", url.Values{"csrf": {csrfOf(t, page)}})
	_, page = b.get(base + "/services/" + sid + "?range=7d")
	if !strings.Contains(page, "CPU: <strong>not running</strong>") || strings.Contains(page, ", now ") {
		t.Errorf("a stopped service's chart shows a current value:\n%s", page)
	}
}

// axisStart is the time axis's first label: the range's first bucket.
func axisStart(now time.Time, window, bucket time.Duration, layout string) string {
	return now.Add(-window).UTC().Truncate(bucket).Format(layout)
}
