package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud/internal/testports"
)

// BenchmarkWake measures connect-to-first-row (pgx.Connect with TLS and
// SCRAM, then SELECT 1) on an auto-paused service, whose connection wakes
// it, beside the same on the service while READY and beside a bare
// PostgreSQL start (pg_ctl start of an initdb'd cluster, then the first
// row over TCP without TLS), in the same run: 20 of each (3 in short
// mode). The idle clock runs at 5 ms a second, so the service pauses
// 0.3 s after each wake's client leaves.
func BenchmarkWake(b *testing.B) {
	n := 20
	if testing.Short() {
		n = 3
	}
	s := newServer(b, "--test-auto-pause-second", "5ms")
	svc := s.create(map[string]any{"name": "wake-bench"})
	pw := svc.InitialPassword
	svc = s.waitStatus(svc.ServiceID, "READY", readyWithin())
	dsn := s.dsn(svc, pw)
	s.setAutoPause(svc.ServiceID, 60)
	var wake, ready []time.Duration
	var wakes []createTiming
	for range n {
		s.waitStatus(svc.ServiceID, "PAUSED", 2*time.Minute)
		begin := time.Now()
		took := firstRow(b, dsn, false)
		wake = append(wake, took)
		wakes = append(wakes, createTiming{id: svc.ServiceID, start: begin, took: took})
		s.waitStatus(svc.ServiceID, "READY", time.Minute)
	}
	// Where the median wake's time went, from the server's log.
	p50 := percentile(wake, 0.5)
	for _, w := range wakes {
		if w.took == p50 {
			b.Logf("steps of the p50 wake (%v), ms from the client's connect:\n%s\nPostgreSQL's log of it:\n%s",
				p50.Round(time.Millisecond), s.steps(w), s.serverLogOf(w))
			break
		}
	}
	s.setAutoPause(svc.ServiceID, 0)
	for range n {
		ready = append(ready, firstRow(b, dsn, false))
	}
	bare := bareStarts(b, n)
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"wake", wake}, {"ready", ready}, {"bare", bare}} {
		b.ReportMetric(float64(percentile(m.d, 0.5).Microseconds())/1000, m.name+"-p50-ms")
		b.ReportMetric(float64(percentile(m.d, 0.95).Microseconds())/1000, m.name+"-p95-ms")
	}
	b.ReportMetric(float64(percentile(wake, 0.5))/float64(percentile(bare, 0.5)), "wake/bare-p50")
	b.ReportMetric(0, "ns/op")
}

// serverLogOf lists what the service's PostgreSQL logged (its jsonlog
// files) while t ran, as "<ms since t's start> <process> <message>" lines.
func (s *server) serverLogOf(t createTiming) string {
	files, _ := filepath.Glob(filepath.Join(s.runtimeDir(), "services", t.id, "*", "log", "*.json"))
	var out strings.Builder
	for _, f := range files {
		raw, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(raw), "\n") {
			var entry struct {
				Timestamp   string `json:"timestamp"`
				BackendType string `json:"backend_type"`
				Message     string `json:"message"`
			}
			if json.Unmarshal([]byte(line), &entry) != nil {
				continue
			}
			at, err := time.Parse("2006-01-02 15:04:05.000 MST", entry.Timestamp)
			// The log's millisecond precision: from a millisecond before.
			if err != nil || at.Before(t.start.Add(-time.Millisecond)) || at.After(t.start.Add(t.took)) {
				continue
			}
			fmt.Fprintf(&out, "  %6.0f  %s: %s\n", float64(at.Sub(t.start).Milliseconds()), entry.BackendType, entry.Message)
		}
	}
	return out.String()
}

// firstRow times one connection and its first row; with retry it tries
// again every 2 ms until the server answers (a bare start's).
func firstRow(b *testing.B, dsn string, retry bool) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	begin := time.Now()
	for {
		c, err := pgx.Connect(ctx, dsn)
		if err == nil {
			var one int
			err = c.QueryRow(ctx, "SELECT 1").Scan(&one)
			c.Close(ctx)
			if err == nil {
				return time.Since(begin)
			}
		}
		if !retry || ctx.Err() != nil {
			b.Fatalf("first row: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// bareStarts times n starts of a cluster of its own by pg_ctl, each to
// its first row, as PostgreSQL's OS user.
func bareStarts(b *testing.B, n int) []time.Duration {
	dir, err := os.MkdirTemp("", "dbcloud-bare-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	run := func(args ...string) {
		out, err := exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...).CombinedOutput()
		if err != nil {
			b.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		b.Fatal(err)
	}
	run(filepath.Join(pgBin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
	port := testports.MustPort(b)
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", port, dir)
	dsn := "postgresql://postgres@127.0.0.1:" + strconv.Itoa(port) + "/postgres?sslmode=disable&connect_timeout=5"
	stop := func() { run(filepath.Join(pgBin, "pg_ctl"), "stop", "-D", data, "-m", "fast", "-w") }
	var took []time.Duration
	for range n {
		begin := time.Now()
		// -W: pg_ctl's own wait polls every 100 ms; firstRow every 2.
		run(filepath.Join(pgBin, "pg_ctl"), "start", "-W", "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"))
		firstRow(b, dsn, true)
		took = append(took, time.Since(begin))
		stop()
	}
	return took
}
