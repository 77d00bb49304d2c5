package main

import (
	"bufio"
	"bytes"
	"context"
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
	args := []string{"test", "-run", "^$", "-bench", g.Bench, "-benchtime", g.Benchtime, "-timeout", g.Timeout}
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
		return results, fmt.Errorf("%s: %v%s", g, err, failureLines(out.Bytes()))
	case len(results) == 0:
		return nil, fmt.Errorf("no benchmark matching %s in %s", g.Bench, g.Pkg)
	}
	return results, nil
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
// the FAIL lines with the message under each, panics and timeouts.
func failureLines(out []byte) string {
	var picked []string
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "--- FAIL"):
			picked = append(picked, t)
			if i+1 < len(lines) {
				picked = append(picked, strings.TrimSpace(lines[i+1]))
			}
		case strings.HasPrefix(t, "panic:"), strings.Contains(t, "test timed out"), strings.HasPrefix(t, "# "),
			strings.Contains(t, "cannot find package"), strings.Contains(t, "build failed"):
			picked = append(picked, t)
		}
		if len(picked) >= 6 {
			break
		}
	}
	if len(picked) == 0 {
		return ""
	}
	for i, p := range picked {
		if len(p) > 300 {
			picked[i] = p[:300] + "…"
		}
	}
	return ": " + strings.Join(picked, " / ")
}
