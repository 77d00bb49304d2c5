package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BenchmarkNoisyNeighbour measures what CPU-bound shared tenants cost a
// dedicated service beside them (issue 38): pgbench's select-only latency
// on a dedicated 500/2 service while every shared service is idle, then
// while noisy shared tenants each run CPU-bound queries on both of their
// sessions (each tenant is capped at half a core and weighs a sixteenth
// of the dedicated half core). Reported side by side in one run, with
// their ratio. Servers run with default flags.
//
//	go test -run '^$' -bench '^BenchmarkNoisyNeighbour$' -benchtime 1x ./e2e/
func BenchmarkNoisyNeighbour(b *testing.B) {
	pgbench := "/usr/lib/postgresql/15/bin/pgbench"
	if _, err := os.Stat(pgbench); err != nil {
		b.Skip("pgbench not installed")
	}
	noisy, window := 6, 15*time.Second
	if testing.Short() {
		noisy, window = 4, 5*time.Second
	}
	for b.Loop() {
		s := newServer(b)
		ded := s.create(map[string]any{"name": "dedicated", "cpu_millis": "500"})
		var shared []service
		for i := range noisy {
			shared = append(shared, s.create(map[string]any{"name": fmt.Sprintf("noisy-%d", i), "cpu_millis": "shared"}))
		}
		dsvc := s.waitStatus(ded.ServiceID, "READY", 3*time.Minute)
		for i := range shared {
			shared[i].Endpoint = s.waitStatus(shared[i].ServiceID, "READY", 3*time.Minute).Endpoint
		}
		env := append(os.Environ(), "PGPASSWORD="+ded.InitialPassword, "PGSSLMODE=require")
		conn := []string{"-h", dsvc.Endpoint.Host, "-p", strconv.Itoa(dsvc.Endpoint.Port), "-U", "tsdbadmin", "tsdb"}
		run := func(args ...string) string {
			cmd := exec.Command(pgbench, append(args, conn...)...)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				b.Fatalf("pgbench %v: %v\n%s", args, err, out)
			}
			return string(out)
		}
		run("-i", "-s", "5", "-q")
		latency := func() float64 {
			out := run("-S", "-n", "-c", "2", "-j", "2", "-T", strconv.Itoa(int(window.Seconds())))
			m := regexp.MustCompile(`latency average = ([0-9.]+) ms`).FindStringSubmatch(out)
			if m == nil {
				b.Fatalf("no latency in pgbench's output:\n%s", out)
			}
			v, _ := strconv.ParseFloat(m[1], 64)
			return v
		}
		quiet := latency()
		ctx, cancel := context.WithCancel(context.Background())
		started := 0
		for _, sh := range shared {
			for range 2 {
				c, err := s.connect(ctx, sh, sh.InitialPassword)
				if err != nil {
					b.Fatalf("connect to %s: %v", sh.ServiceID, err)
				}
				defer c.Close(context.Background())
				go func(c *pgx.Conn) {
					// Pure CPU: no rows kept, no temporary files.
					c.Exec(ctx, "DO $$ BEGIN LOOP PERFORM 1; END LOOP; END $$")
				}(c)
				started++
			}
		}
		time.Sleep(2 * time.Second) // the noise running before the measurement
		loud := latency()
		cancel()
		b.ReportMetric(quiet, "quiet-latency-ms")
		b.ReportMetric(loud, "noisy-latency-ms")
		b.ReportMetric(loud/quiet, "noisy/quiet")
		b.ReportMetric(0, "ns/op")
		b.Logf("dedicated 500/2, pgbench -S -c 2 for %v: %.3f ms with %d shared services idle, %.3f ms with %d CPU-bound sessions on them (%.2fx)",
			window, quiet, noisy, loud, started, loud/quiet)
	}
}
