// Package promtest reads a Prometheus /metrics endpoint in tests, with
// Prometheus's own text-format parser, so what a test checks is what a
// Prometheus server would ingest.
package promtest

import (
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape fetches url and parses it; any failure fails tb.
func Scrape(tb testing.TB, url string) map[string]*dto.MetricFamily {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		tb.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// Label returns the value of m's label name, or "".
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Value returns a gauge's or counter's value.
func Value(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}
