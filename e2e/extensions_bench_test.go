package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BenchmarkTimescale compares a TIMESERIESDB service's hypertable with a
// plain table in the same service and run, and idle TIMESERIESDB services
// with idle POSTGRES ones:
//
//   - hypertable: COPY of 1,000,000 rows (10 days, daily chunks) into the
//     hypertable and into a plain table with the same time index, in
//     alternating order over 3 rounds (median rows/s of each); then an
//     hourly aggregate over all rows and over one day, with time_bucket on
//     the hypertable and date_trunc on the plain table, 5 times each,
//     alternating (median ms).
//   - idle: 3 shared services of each type, created alternately, idle for
//     two metrics rounds: the median of their memory as their metrics show
//     it (cgroup working set).
//
// -short: 20,000 rows, 1 round, 2 queries, 1 service of each type.
//
//	go test -run '^$' -bench '^BenchmarkTimescale$' -benchtime 1x -timeout 30m ./e2e/
func BenchmarkTimescale(b *testing.B) {
	requireExtension(b, "timescaledb")
	b.Run("hypertable", benchHypertable)
	b.Run("idle", benchTimescaleIdle)
}

func benchHypertable(b *testing.B) {
	rows, rounds, queries := 1_000_000, 3, 5
	if testing.Short() {
		rows, rounds, queries = 20_000, 1, 2
	}
	s := newServer(b, "--pool-size", "2")
	ctx := context.Background()
	created := s.create(map[string]any{"name": "bench-ts", "addons": []string{"time-series"}, "cpu_millis": "1000", "memory_gbs": "4"})
	svc := s.waitStatus(created.ServiceID, "READY", 2*time.Minute)
	c, err := s.connect(ctx, svc, created.InitialPassword)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, `
		CREATE TABLE hyper (t timestamptz NOT NULL, device int NOT NULL, v double precision NOT NULL);
		SELECT create_hypertable('hyper', by_range('t', INTERVAL '1 day'));
		CREATE TABLE plain (t timestamptz NOT NULL, device int NOT NULL, v double precision NOT NULL);
		CREATE INDEX plain_t_idx ON plain (t DESC)`); err != nil { // the index create_hypertable makes
		b.Fatal(err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	step := 10 * 24 * time.Hour / time.Duration(rows)
	copyInto := func(table string) float64 {
		i := 0
		begin := time.Now()
		n, err := c.CopyFrom(ctx, pgx.Identifier{table}, []string{"t", "device", "v"}, pgx.CopyFromFunc(func() ([]any, error) {
			if i == rows {
				return nil, nil
			}
			row := []any{start.Add(time.Duration(i) * step), int32(i % 100), float64(i % 1000)}
			i++
			return row, nil
		}))
		took := time.Since(begin)
		if err != nil || n != int64(rows) {
			b.Fatalf("COPY into %s: %d rows, %v", table, n, err)
		}
		return float64(rows) / took.Seconds()
	}
	timeQuery := func(sql string) (time.Duration, string) {
		begin := time.Now()
		var answer string
		if err := c.QueryRow(ctx, sql).Scan(&answer); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
		return time.Since(begin), answer
	}
	// One text digest of the hourly aggregate, so both tables' answers
	// are compared, not only timed.
	hourly := func(table, bucket, where string) string {
		return fmt.Sprintf(`SELECT count(*) || ' ' || sum(n) || ' ' || round(sum(a)::numeric, 6) FROM (
			SELECT %s AS h, count(*) AS n, avg(v) AS a FROM %s %s GROUP BY h) q`, bucket, table, where)
	}
	const day = `WHERE t >= '2026-01-05' AND t < '2026-01-06'`

	for b.Loop() {
		var hyperRate, plainRate []float64
		for r := range rounds {
			if _, err := c.Exec(ctx, `TRUNCATE hyper; TRUNCATE plain`); err != nil {
				b.Fatal(err)
			}
			if r%2 == 0 {
				hyperRate = append(hyperRate, copyInto("hyper"))
				plainRate = append(plainRate, copyInto("plain"))
			} else {
				plainRate = append(plainRate, copyInto("plain"))
				hyperRate = append(hyperRate, copyInto("hyper"))
			}
			b.Logf("round %d: COPY of %d rows: hypertable %.0f rows/s, plain table %.0f rows/s", r+1, rows, hyperRate[r], plainRate[r])
		}
		for _, sql := range []string{`VACUUM ANALYZE hyper`, `VACUUM ANALYZE plain`} {
			if _, err := c.Exec(ctx, sql); err != nil {
				b.Fatal(err)
			}
		}
		var chunks int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM show_chunks('hyper')`).Scan(&chunks); err != nil || chunks < 10 {
			b.Fatalf("hypertable has %d chunks: %v", chunks, err)
		}
		medianMS := func(d []time.Duration) float64 { return float64(percentile(d, 0.5).Microseconds()) / 1000 }
		report := map[string]float64{
			"hyper-rows/s": medianOf(hyperRate), "plain-rows/s": medianOf(plainRate),
		}
		for _, q := range []struct{ name, where string }{{"all", ""}, {"day", day}} {
			var tb, dt []time.Duration
			for range queries {
				d1, a1 := timeQuery(hourly("hyper", "time_bucket('1 hour', t)", q.where))
				d2, a2 := timeQuery(hourly("plain", "date_trunc('hour', t)", q.where))
				if a1 != a2 {
					b.Fatalf("%s: the hypertable answers %q, the plain table %q", q.name, a1, a2)
				}
				tb, dt = append(tb, d1), append(dt, d2)
			}
			report[q.name+"-bucket-ms"], report[q.name+"-trunc-ms"] = medianMS(tb), medianMS(dt)
		}
		for k, v := range report {
			b.ReportMetric(v, k)
		}
		b.ReportMetric(report["hyper-rows/s"]/report["plain-rows/s"], "ingest-hyper/plain")
		b.ReportMetric(float64(rows), "rows")
		b.ReportMetric(float64(chunks), "chunks")
		b.ReportMetric(0, "ns/op")
	}
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func benchTimescaleIdle(b *testing.B) {
	n := 3
	if testing.Short() {
		n = 1
	}
	s := newServer(b, "--pool-size", "2")
	for b.Loop() {
		ids := map[string][]string{}
		for range n {
			for _, addons := range [][]string{{"time-series"}, nil} {
				body := map[string]any{"name": "idle-" + strconv.Itoa(len(ids["TIMESERIESDB"])+len(ids["POSTGRES"])), "cpu_millis": "shared"}
				typ := "POSTGRES"
				if addons != nil {
					body["addons"], typ = addons, "TIMESERIESDB"
				}
				created := s.create(body)
				s.waitStatus(created.ServiceID, "READY", time.Minute)
				ids[typ] = append(ids[typ], created.ServiceID)
			}
		}
		time.Sleep(12 * time.Second) // idle, and two metrics rounds
		mem := map[string]float64{}
		for typ, list := range ids {
			var mems []float64
			for _, id := range list {
				if svc, _ := s.get(id); svc.Metrics != nil {
					mems = append(mems, float64(svc.Metrics.MemoryMB))
				}
			}
			if len(mems) == 0 {
				b.Fatalf("no metrics for the %s services", typ)
			}
			mem[typ] = medianOf(mems)
		}
		b.ReportMetric(mem["TIMESERIESDB"], "tsdb-idle-MB")
		b.ReportMetric(mem["POSTGRES"], "pg-idle-MB")
		b.ReportMetric(float64(n), "services-of-each")
		b.ReportMetric(0, "ns/op")
	}
}
