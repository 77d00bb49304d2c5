package e2e

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkUpgradeBlueGreen measures the write pause of a BLUE_GREEN
// upgrade from PostgreSQL 15 to 17 as a client sees it: the longest gap
// between two commits of a writer that commits one row at a time through
// the endpoint throughout, reconnecting when its session is ended, once
// the new cluster is filled (the switch). Beside it: the writer's longest
// gap before that (from the 202 to the end of the copy: a restart of the
// old primary would show there), its longest over the whole upgrade, and
// the upgrade's time from accepted to READY. -short loads 16 MiB, to check
// the benchmark runs.
// Run it once:
//
//	go test ./e2e -run '^$' -bench '^BenchmarkUpgradeBlueGreen$' -benchtime 1x -timeout 60m
func BenchmarkUpgradeBlueGreen(b *testing.B) {
	requirePGVersion(b, 17)
	mib := int64(256)
	if testing.Short() {
		mib = 16
	}
	b.Run(strconv.FormatInt(mib, 10)+"MiB", func(b *testing.B) {
		s := newServer(b, "--storage-mib-per-memory-gib", "3072")
		var pause, before, longest, total []float64
		for range b.N {
			p, m, t := benchBlueGreenOnce(b, s, mib)
			pause, before, total = append(pause, p.Seconds()), append(before, m.Seconds()), append(total, t.Seconds())
			longest = append(longest, max(p, m).Seconds())
		}
		b.ReportMetric(medianOf(pause), "switch-pause-s")
		b.ReportMetric(medianOf(before), "before-switch-gap-s")
		b.ReportMetric(medianOf(longest), "upgrade-longest-gap-s")
		b.ReportMetric(medianOf(total), "accept-to-ready-s")
		b.ReportMetric(1, "goal-switch-pause-s")
	})
}

// benchBlueGreenOnce creates a 15 service holding about mib MiB, upgrades
// it to 17 by BLUE_GREEN under a writer, and returns the writer's longest
// gap across the switch, its longest gap from the 202 to the end of the
// copy, and the upgrade's time from accepted to READY.
func benchBlueGreenOnce(b *testing.B, s *server, mib int64) (pause, before, total time.Duration) {
	b.StopTimer()
	svc, w := s.upgradeBenchService(b, "bench-bluegreen", mib)
	defer w.halt()
	evctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	stream, closeStream := s.events(evctx, "0")
	defer closeStream()
	b.StartTimer()
	began := time.Now()
	var accepted service
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/upgrade", map[string]any{"pg_version": 17, "method": "BLUE_GREEN"}, &accepted); code != 202 {
		b.Fatalf("upgrade: %d %s", code, accepted.Message)
	}
	readUntil(b, stream, 0, func(e streamEvent) bool {
		return e.Type == "service.upgrade_step" && e.ResourceID == svc.ServiceID && (e.Status == "copy" || e.Status == "rolled_back")
	})
	copied := time.Now()
	after := s.waitStatus(svc.ServiceID, "READY", 30*time.Minute)
	total = time.Since(began)
	b.StopTimer()
	w.commitAfter(b, time.Now())
	acks := w.halt()
	if after.StatusReason != "" {
		b.Fatalf("the upgrade failed: %s", after.StatusReason)
	}
	pause, before = longestGap(acks, copied, time.Time{}), longestGap(acks, began, copied)
	b.Logf("%d MiB: switch pause %v, longest gap before the switch %v, accepted to READY %v, %d commits",
		mib, pause.Round(time.Millisecond), before.Round(time.Millisecond), total.Round(time.Millisecond), len(acks))
	s.call("DELETE", s.services()+"/"+svc.ServiceID, nil, nil)
	s.waitGone(svc.ServiceID, 2*time.Minute)
	return pause, before, total
}
