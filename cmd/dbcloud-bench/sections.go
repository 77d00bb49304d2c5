package main

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// section is one part of the report: a benchmark run as go test runs it,
// maybe several rounds, and how its results are shown.
type section struct {
	ID, Title string
	Test      goTest
	// ShortTimeout replaces Test.Timeout in short mode.
	ShortTimeout string
	// Rounds runs the command this many times (ShortRounds in short mode)
	// and keeps the median of each metric; the benchmarks alternate within
	// a round, so load from other processes falls on all of them.
	Rounds, ShortRounds int
	// Summarize turns the results of every round into the rows shown;
	// medians by default.
	Summarize func(rounds [][]Result) []Result
	Columns   []column
	// About says what the numbers are, for the report.
	About string
}

// column is one metric shown in a section's table.
type column struct{ Key, Header string }

func cols(kv ...string) []column {
	var c []column
	for i := 0; i+1 < len(kv); i += 2 {
		c = append(c, column{kv[i], kv[i+1]})
	}
	return c
}

// sections are the report's parts, in the order they run.
func sections() []section {
	return []section{
		{
			ID: "create", Title: "Create to READY",
			Test:    goTest{Pkg: "./e2e/", Bench: "^BenchmarkCreateToReady$", Benchtime: "1x", Timeout: "30m"},
			Columns: cols("p50-ms", "p50 ms", "p95-ms", "p95 ms", "p50/floor", "p50/floor", "p95/p50", "p95/p50"),
			About: "Shared services created one after another through the API, from the POST to the first GET " +
				"(every 2 ms) that shows READY. floor: in the same run, a prepared cluster taken from a pool with the " +
				"runtime's own code, sizes and limits, from the rename to the first TLS login with a password set " +
				"just before (what no create can beat). pool: 20 creates with a full pool of prepared clusters (the " +
				"steady state); burst: 20 creates back to back with the default pool of 2, which grows and refills " +
				"ahead while creates wait for clusters being prepared. The server runs on its default storage (a btrfs " +
				"image, where each pool entry is a volume that a create takes whole as its service's); each row starts " +
				"once the pool of the version creates get is full, or has stopped filling. The run's log shows the " +
				"server's steps of the p50 and p95 creates. Short mode: 3 creates.",
		},
		{
			ID: "wake", Title: "Wake on connect",
			Test:    goTest{Pkg: "./e2e/", Bench: "^BenchmarkWake$", Benchtime: "1x", Timeout: "30m"},
			Columns: cols("wake-p50-ms", "wake p50 ms", "wake-p95-ms", "wake p95 ms", "ready-p50-ms", "READY p50 ms", "ready-p95-ms", "READY p95 ms", "bare-p50-ms", "bare start p50 ms", "bare-p95-ms", "bare start p95 ms", "wake/bare-p50", "wake/bare p50"),
			About: "Connect-to-first-row (pgx.Connect with TLS verify-full and SCRAM, then SELECT 1) on an auto-paused " +
				"service, whose connection is held while it wakes; beside the same on the service while READY, and beside " +
				"a bare `pg_ctl start -W` of an initdb'd cluster and its first row over TCP (polled every 2 ms), in the same " +
				"run: 20 of each. Short mode: 3.",
		},
		{
			ID: "fork", Title: "Forks beside cp -a",
			Test:    goTest{Pkg: "./e2e/", Bench: "^BenchmarkFork$", Benchtime: "1x", Timeout: "120m"},
			Columns: cols("parent-MB", "parent MB", "now-s", "NOW s", "last-snapshot-s", "LAST_SNAPSHOT s", "cp-s", "cp -a s", "now/cp", "NOW/cp", "last/cp", "LAST_SNAPSHOT/cp", "last/now", "LAST_SNAPSHOT/NOW", "cp-sync-s", "cp -a + sync s", "rounds", "rounds"),
			About: "A parent loaded with 1 GiB or 10 GiB of table data (wide rows by INSERT ... SELECT from generate_series), " +
				"then VACUUMed (the rewrite of every page that follows a bulk load is over before the rounds), " +
				"forked NOW and LAST_SNAPSHOT, each timed from the POST to READY, right after a `cp -a` of the parent's data " +
				"directory on the same disk; medians of the rounds. Rows: on a btrfs image dbcloud makes with " +
				"--storage-image-gib (btrfs-image), where copies are clones, " +
				"for both sizes; on the host's filesystem (host) for 1 GiB (FORK_BENCH_HOST_10GIB=1 adds 10 GiB). " +
				"Short mode: 32 MiB and one round (a smoke test, not a measurement).",
		},
		{
			ID: "snapshot-space", Title: "A week of snapshots on disk",
			Test:    goTest{Pkg: "./e2e/", Bench: "^BenchmarkSnapshotSpace$", Benchtime: "1x", Timeout: "60m"},
			Columns: cols("data-MB", "data MB", "snapshots-MB", "7 snapshots MB", "total/data", "(data + snapshots) / data"),
			About: "A parent loaded by pgbench -i -s 65 (about 1 GiB), then seven rounds of an UPDATE of a contiguous 5% of " +
				"pgbench_accounts, each followed by a snapshot; the space the seven snapshots take is the filesystem's used " +
				"space with them minus without them, on an image of the benchmark's own: ext4 (a snapshot is a copy) and " +
				"btrfs (a clone). Data is the data directory without pg_wal, which snapshots leave out. " +
				"Short mode: -s 2 and two snapshots (a smoke test, not a measurement).",
		},
		{
			ID: "logs", Title: "Logs: first page and rare search beside tac | grep",
			Test:         goTest{Pkg: "./pglog/", Bench: "^Benchmark(FirstPage|SearchRare|TacGrepFirstPage|TacGrepRare)$", Benchtime: "10x", Timeout: "30m"},
			Rounds:       5,
			ShortRounds:  2,
			Summarize:    summarizeLogs,
			Columns:      cols("pglog-ms", "reader ms", "tacgrep-ms", "tac | grep -m 500 ms", "ratio", "ratio"),
			ShortTimeout: "10m",
			About: "The log reader over 1,000,000 jsonlog lines (about 460 MB in 100 MB files) beside `tac FILES | grep -m 500 TERM` " +
				"on the same files, as pglog/bench.sh runs them: medians of the rounds, each round 10 runs of each, alternating. " +
				"First page: the newest 500 lines, no filter. Rare search: a term in 1 line of 10,000, so the whole data is scanned. " +
				"Short mode: 20,000 lines.",
		},
		{
			ID: "failover", Title: "Failover",
			Test: goTest{Pkg: "./e2e/", Bench: "^BenchmarkFailover$", Benchtime: "1x", Timeout: "30m"},
			Columns: cols("p50-s", "kill -9: p50 s", "max-s", "kill -9: max s", "removed-p50-s", "data removed: p50 s",
				"removed-max-s", "data removed: max s", "runs", "runs of each"),
			About: "An HA service with two standbys, one synchronous, on the real binary, with a writer through the " +
				"service endpoint: time from the failure of the primary (kill -9 of its postmaster, or its data " +
				"directory removed; alternating) to the first write acknowledged by the new primary. Every run also " +
				"checks that no acknowledged commit was lost. Short mode: 1 run of each.",
		},
		{
			ID: "idle", Title: "Idle memory per shared service",
			Test:    goTest{Pkg: "./e2e/", Bench: "^BenchmarkIdleMemory$", Benchtime: "1x", Timeout: "30m"},
			Columns: cols("median-MB/service", "median MB per service (cgroup)", "host-MB/service", "host MB per service", "services", "services"),
			About: "10 idle shared services: the median of their memory as their metrics show it (cgroup working set), " +
				"and MemAvailable before minus after, per service (other processes on a shared machine move MemAvailable " +
				"too, so that one is noisy and can even come out negative). Short mode: 2 services.",
		},
		{
			ID: "timescale", Title: "TimescaleDB: hypertable beside a plain table; idle memory by service type",
			Test: goTest{Pkg: "./e2e/", Bench: "^BenchmarkTimescale$", Benchtime: "1x", Timeout: "30m"},
			Columns: cols("hyper-rows/s", "COPY into hypertable rows/s", "plain-rows/s", "COPY into plain table rows/s",
				"ingest-hyper/plain", "ingest hypertable/plain", "all-bucket-ms", "time_bucket 10 days ms", "all-trunc-ms", "date_trunc 10 days ms",
				"day-bucket-ms", "time_bucket 1 day ms", "day-trunc-ms", "date_trunc 1 day ms", "rows", "rows", "chunks", "chunks",
				"tsdb-idle-MB", "idle TIMESERIESDB MB", "pg-idle-MB", "idle POSTGRES MB", "services-of-each", "services of each"),
			About: "hypertable: a TIMESERIESDB service of 1000 millicores and 4 GB; COPY (pgx, binary) of 1,000,000 rows " +
				"(10 days, so 10 daily chunks) into a hypertable and into a plain table with the same time index, " +
				"alternating which goes first, 3 rounds, median rows/s; then an hourly count/avg over all rows and over one " +
				"day, time_bucket on the hypertable and date_trunc on the plain table, answers compared, 5 runs each " +
				"alternating, median ms. idle: 3 shared TIMESERIESDB and 3 shared POSTGRES services created alternately, " +
				"idle for two metrics rounds, median memory as their metrics show it (cgroup working set). " +
				"Short mode: 20,000 rows, 1 round, 2 queries, 1 service of each.",
		},
		{
			ID: "api-blackbox", Title: "API, black box: dbcloud serve beside a minimal HTTPS server",
			Test: goTest{Pkg: "./e2e/", Bench: "^BenchmarkAPIBlackBox$", Benchtime: "1x", Timeout: "30m"},
			Columns: cols("req/s", "req/s", "p50-ms", "p50 ms", "p99-ms", "p99 ms", "minimal-req/s", "minimal req/s",
				"minimal-p50-ms", "minimal p50 ms", "minimal-p99-ms", "minimal p99 ms", "ours/min", "req/s ours/minimal",
				"goal-ours/min", "goal: ours/minimal at least", "base-req/s", "base build req/s", "base/min", "base build/minimal",
				"body-bytes", "body bytes", "clients", "clients"),
			About: "What users measure: the real `dbcloud serve` binary (SQLite store, every request logged to a file, " +
				"--rate-limit 0), GET service and list services over HTTPS on loopback with 1,000 services in the project " +
				"(seeded into its store, PAUSED), driven from the benchmark's process by 16 keep-alive HTTP/1.1 clients in a " +
				"closed loop. Beside it, in the same run, a minimal Go HTTPS server in a process of its own answers every " +
				"request with a copy of our answer (same bytes); they take turns in 5 rounds of 3 s (the order alternates), " +
				"req/s is the median of the rounds and latencies are over all rounds. With API_BLACKBOX_BASE=PATH another " +
				"build of the binary (an older commit) serves in the same rounds (base columns). Goals: GET 0.5, list 0.4 of " +
				"the minimal server. Short mode: 100 services, 2 rounds of 0.3 s.",
		},
		{
			ID: "api", Title: "API beside a minimal HTTPS server, in process (a profile tool)",
			Test: goTest{Pkg: "./http/", Bench: "^BenchmarkAPI$", Benchtime: "1x", Timeout: "30m"},
			Columns: cols("req/s", "req/s", "p50-ms", "p50 ms", "p99-ms", "p99 ms", "min-req/s", "minimal req/s",
				"min-p50-ms", "minimal p50 ms", "min-p99-ms", "minimal p99 ms", "ours/min", "req/s ours/minimal", "body-bytes", "body bytes", "clients", "clients"),
			About: "GET service and list services over HTTPS on loopback, 16 keep-alive clients in a closed loop (each sends " +
				"its next request when the last answered), with 1,000 and then 10,000 services in the SQLite store (seeded " +
				"in-process). Beside it, in the same process and run, a minimal Go HTTPS server answers every request with " +
				"a fixed copy of our answer (same bytes); the two alternate in 5 rounds of 3 s, req/s is the median of the " +
				"rounds and latencies are over all rounds. The load generator shares the 2 cores with the servers. " +
				"Short mode: 100 services, 2 rounds of 0.3 s.",
		},
		{
			ID: "load", Title: "Load: 200 clients for 60 s against dbcloud serve",
			Test:      goTest{Pkg: "./e2e/", Bench: "^BenchmarkLoad$", Benchtime: "1x", Timeout: "30m"},
			Summarize: summarizeLoad,
			Columns:   cols("n", "requests", "p50-ms", "p50 ms", "p99-ms", "p99 ms", "429", "429s", "req/s", "req/s", "clients", "clients", "seconds", "seconds"),
			About: "The real binary with --rate-limit and --rate-burst raised to 100000 (one API key sends everything), " +
				"200 keep-alive clients in a closed loop for 60 s, about 80% reads (get/list services, get/list VPCs, " +
				"auth info, logs) and 20% writes (create, rename and delete VPCs each client owns, setEnvironment on " +
				"3 shared services, and client 0 creating, awaiting READY and deleting 3 real services). The run fails " +
				"on any 5xx, any request without an answer, or any accepted write not visible afterwards. " +
				"Short mode: 20 clients for 5 s.",
		},
		{
			ID: "load-open", Title: "Load: 1,000 req/s offered (open loop) against dbcloud serve",
			Test:      goTest{Pkg: "./e2e/", Bench: "^BenchmarkLoadOpen$", Benchtime: "1x", Timeout: "30m"},
			Summarize: summarizeLoad,
			Columns: cols("n", "requests", "p50-ms", "p50 ms", "p99-ms", "p99 ms", "goal-p99-ms", "goal: p99 under ms", "429", "429s",
				"req/s", "req/s", "offered-req/s", "offered req/s", "send-lag-ms", "sent late at most ms", "seconds", "seconds"),
			About: "BenchmarkLoad's server, services and mix (about 80% reads, 20% writes, every accepted write checked " +
				"afterwards) as an open loop: 1,000 requests/s for 60 s, each sent when due whatever earlier ones are doing " +
				"(request i by client i mod 200, a client's requests one at a time), latency from when it was due, so a " +
				"stall counts for every request it delayed (no coordinated omission). all-reads and all-writes pool the " +
				"kinds; goal: p99 under 50 ms for reads and 100 ms for writes. Short mode: 100 requests/s for 5 s.",
		},
		{
			ID: "density", Title: "2,000 shared services on one host, 50 READY and idle, the others parked",
			Test:      goTest{Pkg: "./e2e/", Bench: "^BenchmarkDensity$", Benchtime: "1x", Timeout: "300m"},
			Summarize: summarizeDensity,
			Columns: cols("services", "services", "cpu-cores", "control plane idle CPU (cores)", "host-cpu-cores", "host idle CPU (cores)", "get-p50-ms", "GET p50 ms", "get-p99-ms", "GET p99 ms",
				"list-p50-ms", "list p50 ms", "list-p99-ms", "list p99 ms", "median-MB/service", "median MB per READY service (cgroup)",
				"host-MB/service", "host MB per service", "added-host-MB/service", "host MB per added service",
				"make-s/service", "s to make and park a service", "disk-MB/service", "disk MB per added service",
				"plane-KB/service", "control plane KB per added service", "goroutines/service", "goroutines per added service",
				"fds/service", "open files per added service", "listeners/service", "listeners per added service", "procs/service", "processes per added service",
				"detect-s", "killed postmaster seen s", "repair-s", "READY again s"),
			About: "The real binary with 10 services READY, then 2,000 (DBCLOUD_DENSITY_SERVICES) of which the first 50 stay READY " +
				"and the others are parked a batch of 40 at a time as soon as they are READY (stopped: a stopped service costs what a paused one " +
				"does, no postmaster; DBCLOUD_DENSITY_PARK=autopause parks them with setAutoPause), on serve's btrfs image " +
				"(DBCLOUD_DENSITY_FS=ext4: none), created 8 POSTs at a time with a pool of 4; each step measured once every READY service has " +
				"its first snapshot: the control plane's utime+stime over 30 s as a fraction of one core, and the whole host's busy CPU time " +
				"over the same 30 s; 4 keep-alive clients in a closed loop on GET service (a random one) and list services, alternating, " +
				"3 rounds of 3 s; median memory of the READY services from their metrics (cgroup working set), MemAvailable drop per " +
				"service; per service added from 10 to 2,000: the time to make and park it, its disk (the image's allocated blocks, or du " +
				"on ext4), the control plane's RSS, goroutines and open files, and the listeners on the endpoint ports and processes in " +
				"the runtime directory left for it; every READY service connected to; then a postmaster killed (SIGKILL) and the time " +
				"until the health loop logs it unhealthy and until it is READY again. The last row divides. Short mode: 2 and 4 services, 2 READY.",
		},
	}
}

// summarizeMedians keeps, for each benchmark, the median of each metric
// over the rounds.
func summarizeMedians(rounds [][]Result) []Result {
	var order []string
	values := map[string]map[string][]float64{}
	for _, round := range rounds {
		for _, r := range round {
			if values[r.Name] == nil {
				values[r.Name] = map[string][]float64{}
				order = append(order, r.Name)
			}
			for k, v := range r.Metrics {
				values[r.Name][k] = append(values[r.Name][k], v)
			}
		}
	}
	out := make([]Result, 0, len(order))
	for _, name := range order {
		r := Result{Name: name, Metrics: map[string]float64{}}
		for k, vs := range values[name] {
			r.Metrics[k] = median(vs)
		}
		out = append(out, r)
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summarizeLogs pairs each reader benchmark with its tac | grep baseline.
func summarizeLogs(rounds [][]Result) []Result {
	med := map[string]float64{}
	for _, r := range summarizeMedians(rounds) {
		med[r.Name] = r.Metrics["ns/op"]
	}
	var out []Result
	for _, p := range []struct{ name, ours, base string }{
		{"first page, no filter", "BenchmarkFirstPage", "BenchmarkTacGrepFirstPage"},
		{"search, 1 line in 10,000", "BenchmarkSearchRare", "BenchmarkTacGrepRare"},
	} {
		o, okO := med[p.ours]
		b, okB := med[p.base]
		if !okO || !okB || b == 0 {
			continue
		}
		out = append(out, Result{Name: p.name, Metrics: map[string]float64{
			"pglog-ms": o / 1e6, "tacgrep-ms": b / 1e6, "ratio": o / b, "rounds": float64(len(rounds)),
		}})
	}
	return out
}

// summarizeLoad turns BenchmarkLoad's metrics (<kind>-n, <kind>-p50-ms,
// ...) into a row per kind of request and a total.
func summarizeLoad(rounds [][]Result) []Result {
	var out []Result
	for _, r := range summarizeMedians(rounds) {
		kinds := map[string]map[string]float64{}
		total := Result{Name: "all", Metrics: map[string]float64{}}
		for k, v := range r.Metrics {
			switch k {
			case "req/s", "clients", "seconds", "offered-req/s", "send-lag-ms":
				total.Metrics[k] = v
				continue
			}
			// -goal-p99-ms before -p99-ms, which it ends with.
			for _, suffix := range []string{"-n", "-p50-ms", "-goal-p99-ms", "-p99-ms", "-429"} {
				if kind, ok := strings.CutSuffix(k, suffix); ok {
					if kinds[kind] == nil {
						kinds[kind] = map[string]float64{}
					}
					kinds[kind][suffix[1:]] = v
					break
				}
			}
		}
		names := make([]string, 0, len(kinds))
		for k := range kinds {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			// all-reads and all-writes pool the kinds: not counted twice.
			if !strings.HasPrefix(k, "all-") {
				total.Metrics["n"] += kinds[k]["n"]
				total.Metrics["429"] += kinds[k]["429"]
			}
			out = append(out, Result{Name: k, Metrics: kinds[k]})
		}
		out = append(out, total)
	}
	return out
}

// summarizeDensity turns BenchmarkDensity's metrics (s<N>-<metric>) into a
// row per number of services and a row of the last over the first.
func summarizeDensity(rounds [][]Result) []Result {
	var out []Result
	for _, r := range summarizeMedians(rounds) {
		steps := map[int]map[string]float64{}
		for k, v := range r.Metrics {
			p, metric, ok := strings.Cut(k, "-")
			n, err := strconv.Atoi(strings.TrimPrefix(p, "s"))
			if !ok || !strings.HasPrefix(p, "s") || err != nil {
				continue
			}
			if steps[n] == nil {
				steps[n] = map[string]float64{"services": float64(n)}
			}
			steps[n][metric] = v
		}
		ns := slices.Sorted(maps.Keys(steps))
		for _, n := range ns {
			out = append(out, Result{Name: strconv.Itoa(n) + " services", Metrics: steps[n]})
		}
		if len(ns) < 2 {
			continue
		}
		for _, k := range []string{"added-host-MB/service", "make-s/service", "disk-MB/service", "plane-KB/service",
			"goroutines/service", "fds/service", "listeners/service", "procs/service"} {
			if v, ok := r.Metrics[k]; ok {
				out[len(out)-1].Metrics[k] = v
			}
		}
		first, last := steps[ns[0]], steps[ns[len(ns)-1]]
		ratio := Result{Name: fmt.Sprintf("%d/%d", ns[len(ns)-1], ns[0]), Metrics: map[string]float64{}}
		for _, k := range []string{"cpu-cores", "host-cpu-cores", "get-p50-ms", "get-p99-ms", "list-p50-ms", "list-p99-ms", "median-MB/service", "detect-s", "repair-s"} {
			if first[k] != 0 {
				ratio.Metrics[k] = last[k] / first[k]
			}
		}
		out = append(out, ratio)
	}
	return out
}
