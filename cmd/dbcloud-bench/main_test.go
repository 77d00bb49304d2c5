package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseBench(t *testing.T) {
	out := `goos: linux
BenchmarkCreateToReady/pool-2         	       1	       112.4 p50-ms	       191.2 p95-ms
BenchmarkAPI/get/services=1000-2         	       1	       414.0 body-bytes	  0 ns/op	14628 req/s
--- BENCH: BenchmarkAPI/get/services=1000-2
    api_bench_test.go:195: ours req/s by round [14628 14775]
BenchmarkFork_1GiB-2 1 7484791751 ns/op 1.425 cp-s
BenchmarkHalf-2   	
PASS
`
	got := parseBench([]byte(out))
	if len(got) != 3 {
		t.Fatalf("got %d results: %+v", len(got), got)
	}
	if got[0].Name != "BenchmarkCreateToReady/pool" || got[0].Metrics["p95-ms"] != 191.2 {
		t.Errorf("first: %+v", got[0])
	}
	if got[1].Name != "BenchmarkAPI/get/services=1000" || got[1].Metrics["req/s"] != 14628 {
		t.Errorf("second: %+v", got[1])
	}
	if _, ok := got[1].Metrics["ns/op"]; ok {
		t.Errorf("ns/op of 0 kept: %+v", got[1])
	}
	if got[2].Metrics["ns/op"] != 7484791751 {
		t.Errorf("third: %+v", got[2])
	}
}

func TestSummarizeLogs(t *testing.T) {
	round := func(fp, tf, sr, tr float64) []Result {
		return []Result{
			{Name: "BenchmarkFirstPage", Metrics: map[string]float64{"ns/op": fp}},
			{Name: "BenchmarkSearchRare", Metrics: map[string]float64{"ns/op": sr}},
			{Name: "BenchmarkTacGrepFirstPage", Metrics: map[string]float64{"ns/op": tf}},
			{Name: "BenchmarkTacGrepRare", Metrics: map[string]float64{"ns/op": tr}},
		}
	}
	got := summarizeLogs([][]Result{round(1e6, 4e6, 5e8, 2e8), round(3e6, 6e6, 7e8, 4e8), round(2e6, 5e6, 6e8, 3e8)})
	if len(got) != 2 {
		t.Fatalf("got %+v", got)
	}
	if m := got[0].Metrics; m["pglog-ms"] != 2 || m["tacgrep-ms"] != 5 || m["ratio"] != 0.4 {
		t.Errorf("first page: %+v", m)
	}
	if m := got[1].Metrics; m["pglog-ms"] != 600 || m["tacgrep-ms"] != 300 || m["ratio"] != 2 {
		t.Errorf("search: %+v", m)
	}
}

func TestSummarizeLoad(t *testing.T) {
	got := summarizeLoad([][]Result{{{Name: "BenchmarkLoad", Metrics: map[string]float64{
		"get_service-n": 100, "get_service-p50-ms": 2, "get_service-p99-ms": 9, "get_service-429": 0,
		"create_vpc-n": 10, "create_vpc-p50-ms": 3, "create_vpc-p99-ms": 12, "create_vpc-429": 1,
		"req/s": 55, "clients": 20, "seconds": 2,
	}}}})
	if len(got) != 3 || got[0].Name != "create_vpc" || got[1].Name != "get_service" || got[2].Name != "all" {
		t.Fatalf("rows: %+v", got)
	}
	if m := got[1].Metrics; m["n"] != 100 || m["p99-ms"] != 9 {
		t.Errorf("get_service: %+v", m)
	}
	if m := got[2].Metrics; m["n"] != 110 || m["429"] != 1 || m["req/s"] != 55 {
		t.Errorf("all: %+v", m)
	}
}

// TestRunSection: a benchmark that passes is reported; one that is missing
// or fails is "not run" with the reason, and the run goes on.
func TestRunSection(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	sec := func(id, bench string) section {
		return section{ID: id, Title: id, Test: goTest{Dir: "testdata/benchmod", Pkg: ".", Bench: bench, Benchtime: "1x", Timeout: "2m"},
			Columns: cols("p50-ms", "p50 ms")}
	}
	ok := runSection(t.Context(), sec("ok", "^BenchmarkOK$"), nil, true, dir, false, io.Discard, logger)
	if ok.Status != statusOK || len(ok.Results) != 1 || ok.Results[0].Metrics["p50-ms"] != 12.5 {
		t.Errorf("ok: %+v", ok)
	}
	if !strings.Contains(ok.Command, "-short") {
		t.Errorf("short run command %q has no -short", ok.Command)
	}
	missing := runSection(t.Context(), sec("missing", "^BenchmarkFailover$"), nil, false, dir, false, io.Discard, logger)
	if missing.Status != statusNotRun || missing.Failed || !strings.Contains(missing.Reason, "no benchmark matching ^BenchmarkFailover$") {
		t.Errorf("missing: %+v", missing)
	}
	fails := runSection(t.Context(), sec("fails", "^BenchmarkFails$"), nil, false, dir, false, io.Discard, logger)
	if fails.Status != statusNotRun || !fails.Failed || !strings.Contains(fails.Reason, "the server did not start") {
		t.Errorf("fails: %+v", fails)
	}
	skips := runSection(t.Context(), sec("skips", "^BenchmarkSkips$"), nil, false, dir, false, io.Discard, logger)
	if skips.Status != statusNotRun || skips.Failed || skips.Reason != "skipped: bench_test.go:19: pgbench not installed" {
		t.Errorf("skips: %+v", skips)
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "fails.txt")); err != nil || !strings.Contains(string(raw), "--- FAIL") {
		t.Errorf("raw output: %v %q", err, raw)
	}

	rep := &Report{Command: "make bench", Sections: []SectionReport{ok, missing, fails}}
	out := t.TempDir()
	if err := rep.write(out); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(out, "report.md"))
	for _, want := range []string{"| p50 ms |", "| 12.5 |", "**Not run:** ", "the server did not start", "`make bench`"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q:\n%s", want, md)
		}
	}
	var back Report
	raw, _ := os.ReadFile(filepath.Join(out, "report.json"))
	if err := json.Unmarshal(raw, &back); err != nil || len(back.Sections) != 3 || back.Sections[1].Status != statusNotRun {
		t.Errorf("report.json: %v %s", err, raw)
	}
}

// TestRunSection_Base: with a baseline, each row measured there sits
// right after ours, marked, and a baseline without the benchmark is a
// note, not a failure.
func TestRunSection_Base(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	sec := section{ID: "ok", Title: "ok", Test: goTest{Dir: "testdata/benchmod", Pkg: ".", Bench: "^BenchmarkOK$", Benchtime: "1x", Timeout: "2m"}, Rounds: 2}
	// The same tree stands in for an older commit: what matters is that
	// both ran and how their rows are laid out.
	same := &baseline{Commit: "old", Dir: "."}
	got := runSection(t.Context(), sec, same, false, t.TempDir(), false, io.Discard, logger)
	if got.Status != statusOK || len(got.Results) != 2 || got.Results[0].Name != "BenchmarkOK" ||
		got.Results[1].Name != "BenchmarkOK (base old)" || got.Results[1].Metrics["p50-ms"] != 12.5 || got.BaseNote != "" {
		t.Errorf("with a baseline: %+v", got)
	}
	empty := t.TempDir()
	if err := os.MkdirAll(filepath.Join(empty, "testdata/benchmod"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(empty, "testdata/benchmod/go.mod"), []byte("module benchmod\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := &baseline{Commit: "older", Dir: empty}
	got = runSection(t.Context(), sec, old, false, t.TempDir(), false, io.Discard, logger)
	if got.Status != statusOK || got.Failed || len(got.Results) != 1 || !strings.Contains(got.BaseNote, "at base older") {
		t.Errorf("baseline without the benchmark: %+v", got)
	}
}

func TestInterleave(t *testing.T) {
	b := &baseline{Commit: "abc"}
	got := b.interleave(
		[]Result{{Name: "new"}, {Name: "kept"}},
		[]Result{{Name: "gone"}, {Name: "kept"}})
	var names []string
	for _, r := range got {
		names = append(names, r.Name)
	}
	if want := "new,kept,kept (base abc),gone (base abc)"; strings.Join(names, ",") != want {
		t.Errorf("rows %v, want %s", names, want)
	}
}

func TestRun_ShortRefusesTheRealReport(t *testing.T) {
	err := run(t.Context(), []string{"-short", "-out", realReport}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "must not write") {
		t.Errorf("run -short -out bench: %v, want a refusal", err)
	}
}

func TestSummarizeDensity(t *testing.T) {
	round := func(cpu10, cpu200 float64) []Result {
		return []Result{{Name: "BenchmarkDensity", Metrics: map[string]float64{
			"s10-cpu-cores": cpu10, "s10-get-p50-ms": 2, "s200-cpu-cores": cpu200, "s200-get-p50-ms": 2.4,
			"added-host-MB/service": 30, "services": 200, "disk-MB/service": 49,
		}}}
	}
	got := summarizeDensity([][]Result{round(0.01, 0.05), round(0.02, 0.04), round(0.03, 0.06)})
	if len(got) != 3 || got[0].Name != "10 services" || got[1].Name != "200 services" || got[2].Name != "200/10" {
		t.Fatalf("got %+v", got)
	}
	if m := got[1].Metrics; m["cpu-cores"] != 0.05 || m["services"] != 200 || m["added-host-MB/service"] != 30 || m["disk-MB/service"] != 49 {
		t.Errorf("200: %+v", m)
	}
	if m := got[2].Metrics; m["cpu-cores"] != 2.5 || m["get-p50-ms"] != 1.2 {
		t.Errorf("ratio: %+v", m)
	}
}

func TestSummarizeLoad_OpenLoop(t *testing.T) {
	got := summarizeLoad([][]Result{{{Name: "BenchmarkLoadOpen", Metrics: map[string]float64{
		"get_service-n": 80, "get_service-p99-ms": 12, "create_vpc-n": 20, "create_vpc-p99-ms": 30,
		"all-reads-n": 80, "all-reads-p99-ms": 12, "all-reads-goal-p99-ms": 50, "offered-req/s": 1000, "req/s": 990,
	}}}})
	byName := map[string]map[string]float64{}
	for _, r := range got {
		byName[r.Name] = r.Metrics
	}
	if m := byName["all-reads"]; m["p99-ms"] != 12 || m["goal-p99-ms"] != 50 {
		t.Errorf("all-reads: %+v", m)
	}
	if m := byName["all"]; m["n"] != 100 || m["offered-req/s"] != 1000 {
		t.Errorf("all: %+v (the pooled rows counted twice?)", m)
	}
}
