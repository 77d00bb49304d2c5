package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Result is one benchmark's metrics, by unit as `go test -bench` prints
// them (p50-ms, req/s, ...), or one row a section derives from them.
type Result struct {
	Name    string             `json:"name"`
	Metrics map[string]float64 `json:"metrics"`
}

// goTest is one `go test -bench` invocation.
type goTest struct {
	Pkg, Bench, Benchtime, Timeout string
	Short                          bool
	// Dir is the module root to run in; empty for the current directory.
	Dir string
}

// Args are the arguments of go.
func (g goTest) Args() []string {
	// -v keeps the benchmarks' logs (per-round timings, tables) in the raw
	// output, and says why a benchmark skipped.
	args := []string{"test", "-v", "-run", "^$", "-bench", g.Bench, "-benchtime", g.Benchtime, "-timeout", g.Timeout}
	if g.Short {
		args = append(args, "-short")
	}
	return append(args, g.Pkg)
}

// String is the command as a user types it in a shell.
func (g goTest) String() string {
	parts := []string{"go"}
	for _, a := range g.Args() {
		if strings.ContainsAny(a, "^$|()*?[] ") {
			a = "'" + a + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// run runs the command, copying its output to raw, and returns the
// benchmarks it printed. An error says why there is no full result: the
// command failed, or printed no benchmark at all.
func (g goTest) run(ctx context.Context, raw io.Writer) ([]Result, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", g.Args()...)
	cmd.Stdout = io.MultiWriter(&out, raw)
	cmd.Stderr = cmd.Stdout
	cmd.Dir = g.Dir
	err := cmd.Run()
	results := parseBench(out.Bytes())
	switch {
	case err != nil:
		return results, fmt.Errorf("go test: %v%s", err, failureLines(out.Bytes()))
	case len(results) == 0 && strings.Contains(out.String(), "--- SKIP"):
		return nil, fmt.Errorf("%w%s", errSkipped, skipLines(out.Bytes()))
	case len(results) == 0:
		return nil, fmt.Errorf("%w %s in %s", errMissing, g.Bench, g.Pkg)
	}
	return results, nil
}

// errMissing is a benchmark that is not there: on a branch without it,
// say. It is reported, but it is not a failure.
var errMissing = errors.New("no benchmark matching")

// errSkipped is a benchmark that skipped itself (pgbench not installed,
// say); reported with its reason, not a failure either.
var errSkipped = errors.New("skipped")

// skipLines is what each skipped benchmark logged.
func skipLines(out []byte) string {
	var picked []string
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "--- SKIP") {
			picked = append(picked, logged(lines, i)...)
		}
	}
	return joinReasons(picked)
}

// gomaxprocsSuffix is the -N that go test appends to benchmark names.
var gomaxprocsSuffix = regexp.MustCompile(`-\d+$`)

// parseBench reads the result lines of `go test -bench` output:
// "BenchmarkName-2  1  0 ns/op  81.5 p50-ms ...".
func parseBench(out []byte) []Result {
	var results []Result
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		r := Result{Name: gomaxprocsSuffix.ReplaceAllString(f[0], ""), Metrics: map[string]float64{}}
		ok := true
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				ok = false
				break
			}
			r.Metrics[f[i+1]] = v
		}
		if ok {
			// Benchmarks that report their own metrics set ns/op to 0.
			if r.Metrics["ns/op"] == 0 {
				delete(r.Metrics, "ns/op")
			}
			results = append(results, r)
		}
	}
	return results
}

// failureLines picks what explains a failure out of go test's output:
// each FAIL line with the messages logged around it, panics, timeouts and
// build errors.
func failureLines(out []byte) string {
	var picked []string
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "--- FAIL"):
			picked = append(picked, t)
			picked = append(picked, logged(lines, i)...)
		case strings.HasPrefix(t, "panic:"), strings.Contains(t, "test timed out"), strings.HasPrefix(t, "# "),
			strings.Contains(t, "cannot find package"), strings.Contains(t, "build failed"):
			picked = append(picked, t)
		}
	}
	return joinReasons(picked)
}

// logged returns the indented lines right before and right after line i:
// what the test logged, which go test prints before its --- line with -v
// and after it without.
func logged(lines []string, i int) []string {
	var out []string
	for j := i - 1; j >= 0 && strings.HasPrefix(lines[j], "    "); j-- {
		out = append([]string{strings.TrimSpace(lines[j])}, out...)
	}
	for j := i + 1; j < len(lines) && strings.HasPrefix(lines[j], "    "); j++ {
		out = append(out, strings.TrimSpace(lines[j]))
	}
	return out
}

// joinReasons keeps a reason to a few short lines.
func joinReasons(picked []string) string {
	if len(picked) == 0 {
		return ""
	}
	picked = picked[:min(len(picked), 6)]
	for i, p := range picked {
		if len(p) > 300 {
			picked[i] = p[:300] + "…"
		}
	}
	return ": " + strings.Join(picked, " / ")
}
