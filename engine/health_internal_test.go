package engine

import (
	"strconv"
	"testing"
	"time"

	"dbcloud"
)

// TestMetricsDue_Spread: services made together are measured over the
// metrics interval, a share each health round, the longest unmeasured
// first, and each still once per interval.
func TestMetricsDue_Spread(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := &Engine{HealthInterval: time.Second, MetricsInterval: 5 * time.Second, Now: func() time.Time { return now },
		measured: map[string]time.Time{}}
	var svcs []*dbcloud.Service
	for i := range 10 {
		svcs = append(svcs, &dbcloud.Service{ID: "s" + strconv.Itoa(i)})
		e.measured[svcs[i].ID] = now.Add(-6 * time.Second)
	}
	e.measured["s9"] = now.Add(-time.Hour) // measured long ago: first
	count := map[string]int{}
	for round := range 15 {
		due := e.metricsDue(svcs)
		if len(due) != 2 {
			t.Fatalf("round %d: %d due, want 10 services / 5 rounds = 2", round, len(due))
		}
		if round == 0 && !due["s9"] {
			t.Errorf("round 0: %v, want s9 (measured an hour ago) among them", due)
		}
		for id := range due {
			count[id]++
			e.measured[id] = now
		}
		now = now.Add(time.Second)
	}
	for _, svc := range svcs {
		if count[svc.ID] != 3 {
			t.Errorf("%s measured %d times in 15 rounds of 1 s, want every 5 s: 3", svc.ID, count[svc.ID])
		}
	}
	// Measured within the interval: not due, whatever the budget.
	e.measured["s0"] = now.Add(-time.Second)
	if due := e.metricsDue(svcs[:1]); len(due) != 0 {
		t.Errorf("just measured, yet due: %v", due)
	}
}
