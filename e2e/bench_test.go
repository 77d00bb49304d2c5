package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readyPool counts the prepared clusters waiting in the server's pool.
func (s *server) readyPool() int {
	n, _ := filepath.Glob(filepath.Join(s.dir, "runtime", "pool", "ready-*"))
	return len(n)
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// benchCreates creates n shared services one after another and returns the
// time from the POST to the first GET that shows READY.
func benchCreates(b *testing.B, s *server, n int, pause time.Duration) []time.Duration {
	var took []time.Duration
	for i := range n {
		start := time.Now()
		created := s.create(map[string]any{"name": "bench-" + strconv.Itoa(i), "cpu_millis": "shared"})
		for {
			svc, _ := s.get(created.ServiceID)
			if svc.Status == "READY" {
				break
			}
			if svc.Status == "UNSTABLE" || time.Since(start) > time.Minute {
				b.Fatalf("create %d: %s %s", i, svc.Status, svc.StatusReason)
			}
			time.Sleep(2 * time.Millisecond)
		}
		took = append(took, time.Since(start))
		time.Sleep(pause)
	}
	return took
}

// BenchmarkCreateToReady measures create to READY over 20 creates, as the
// API shows it (POST, then GET every 2 ms). "pool" starts with a full pool
// of prepared clusters, the steady state; "burst" has the default pool of 2
// and creates back to back, so later creates wait for initdb. -short makes
// 3 creates of each.
// Run: go test -run '^$' -bench CreateToReady -benchtime 1x ./e2e/
func BenchmarkCreateToReady(b *testing.B) {
	creates := 20
	if testing.Short() {
		creates = 3
	}
	for _, tc := range []struct {
		name  string
		pool  int
		pause time.Duration
	}{{"pool", creates, 0}, {"burst", 2, 0}} {
		b.Run(tc.name, func(b *testing.B) {
			s := newServer(b, "--pool-size", strconv.Itoa(tc.pool), "--quota-services", "50")
			deadline := time.Now().Add(3 * time.Minute)
			for s.readyPool() < tc.pool && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			b.ResetTimer()
			var took []time.Duration
			for b.Loop() {
				took = append(took, benchCreates(b, s, creates, tc.pause)...)
			}
			b.ReportMetric(float64(percentile(took, 0.5).Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(percentile(took, 0.95).Microseconds())/1000, "p95-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkIdleMemory reports the memory (cgroup working set) of idle shared
// services, as their metrics show it, and the host memory they take, over
// 10 services (2 with -short).
// Run: go test -run '^$' -bench IdleMemory -benchtime 1x ./e2e/
func BenchmarkIdleMemory(b *testing.B) {
	s := newServer(b, "--pool-size", "2")
	n := 10
	if testing.Short() {
		n = 2
	}
	for b.Loop() {
		before := memAvailable()
		ids := []string{}
		for i := range n {
			created := s.create(map[string]any{"name": "idle-" + strconv.Itoa(i), "cpu_millis": "shared"})
			ids = append(ids, created.ServiceID)
			s.waitStatus(created.ServiceID, "READY", time.Minute)
		}
		time.Sleep(12 * time.Second) // idle, and two metrics rounds
		var mems []float64
		for _, id := range ids {
			svc, _ := s.get(id)
			if svc.Metrics != nil {
				mems = append(mems, float64(svc.Metrics.MemoryMB))
			}
		}
		slices.Sort(mems)
		if len(mems) == 0 {
			b.Fatal("no metrics")
		}
		b.ReportMetric(mems[len(mems)/2], "median-MB/service")
		b.ReportMetric(float64(before-memAvailable())/float64(n)/(1<<20), "host-MB/service")
		b.ReportMetric(float64(n), "services")
		b.ReportMetric(0, "ns/op")
	}
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() int64 {
	raw, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkFailover measures failover of an HA service (two standbys, one
// synchronous) on the real binary: from the failure of the primary to the
// first write acknowledged by the new primary through the service
// endpoint, 5 times by SIGKILL and 5 times by removing the primary's data
// directory, alternating. Each run also checks that no acknowledged commit
// was lost and waits for the old primary to be rebuilt before the next.
// -short runs each case once.
//
//	go test -run '^$' -bench '^BenchmarkFailover$' -benchtime 1x -timeout 30m ./e2e/
func BenchmarkFailover(b *testing.B) {
	runs := 5
	if testing.Short() {
		runs = 1
	}
	for range b.N {
		s := newServer(b)
		svc, password := s.haService(b)
		var kill, removed []time.Duration
		for i := range 2 * runs {
			brk, into := killPrimary, &kill
			if i%2 == 1 {
				brk, into = removePrimaryData, &removed
			}
			r := s.failover(b, svc, password, (i+1)*1_000_000, brk)
			*into = append(*into, r.took)
			b.Logf("run %d (%s): %v, %d acknowledged commits, none lost", i+1, map[bool]string{true: "SIGKILL", false: "data removed"}[i%2 == 0], r.took, r.acked)
		}
		b.ReportMetric(percentile(kill, 0.5).Seconds(), "p50-s")
		b.ReportMetric(percentile(kill, 1).Seconds(), "max-s")
		b.ReportMetric(percentile(removed, 0.5).Seconds(), "removed-p50-s")
		b.ReportMetric(percentile(removed, 1).Seconds(), "removed-max-s")
		b.ReportMetric(float64(runs), "runs")
		b.ReportMetric(0, "ns/op")
	}
}
