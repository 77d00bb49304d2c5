// Command dbcloud-testlog reads `go test -json` on standard input and
// prints what a plain `go test` prints (a line per package, and the whole
// output of every test and package that failed), then the slowest tests.
// CI runs the suite through it (scripts/test.sh), so that every run's log
// says where its time went: on a 2-core machine the suite's own time is
// most of CI's 90 minutes, and a test that grows slower shows up here
// before the limit does.
//
//	go test -json ./... | go run ./cmd/dbcloud-testlog -slowest 25
//
// Its exit status is 1 when a test or package failed, so a pipeline under
// `set -o pipefail` fails whichever side saw it first.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

func main() {
	slowest := flag.Int("slowest", 20, "how many of the slowest tests to list at the end")
	flag.Parse()
	failed, err := summarize(os.Stdin, os.Stdout, *slowest)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dbcloud-testlog:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// timing is one finished top-level test.
type timing struct {
	pkg, test string
	seconds   float64
	failed    bool
}

// summarize copies the plain output of in to out as packages finish and
// reports whether anything failed. Output is held per test until the test
// ends: a passing test's is dropped, a failing one's printed whole.
func summarize(in io.Reader, out io.Writer, slowest int) (failed bool, err error) {
	held := map[[2]string][]string{} // package, test -> output lines
	var times []timing
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			// go test's own messages (build errors) are not JSON.
			fmt.Fprintln(out, string(line))
			continue
		}
		key := [2]string{e.Package, e.Test}
		switch e.Action {
		case "build-output": // a compile error, before any test ran
			io.WriteString(out, e.Output)
		case "build-fail":
			failed = true
		case "output":
			held[key] = append(held[key], e.Output)
		case "pass", "skip":
			if e.Test == "" {
				// The package's closing lines: "ok  \tpkg\t1.2s" or "?   \tpkg\t[no test files]".
				for _, o := range held[key] {
					if strings.HasPrefix(o, "ok  ") || strings.HasPrefix(o, "?   ") {
						io.WriteString(out, o)
					}
				}
			} else if e.Action == "pass" && !strings.Contains(e.Test, "/") {
				times = append(times, timing{e.Package, e.Test, e.Elapsed, false})
			}
			delete(held, key)
		case "fail":
			failed = true
			io.WriteString(out, strings.Join(held[key], ""))
			delete(held, key)
			if e.Test != "" && !strings.Contains(e.Test, "/") {
				times = append(times, timing{e.Package, e.Test, e.Elapsed, true})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return failed, err
	}
	// A test binary that died (a timeout's panic) leaves its running
	// tests' output without an end: it explains the package's failure.
	for _, key := range slices.SortedFunc(maps.Keys(held), func(a, b [2]string) int {
		return strings.Compare(a[0]+" "+a[1], b[0]+" "+b[1])
	}) {
		if lines := held[key]; len(lines) > 0 && key[1] != "" {
			fmt.Fprintf(out, "--- output of %s %s, which never finished:\n%s", key[0], key[1], strings.Join(lines, ""))
		}
	}
	printSlowest(out, times, slowest)
	return failed, nil
}

func printSlowest(out io.Writer, times []timing, n int) {
	if n <= 0 || len(times) == 0 {
		return
	}
	slices.SortFunc(times, func(a, b timing) int {
		switch {
		case a.seconds > b.seconds:
			return -1
		case a.seconds < b.seconds:
			return 1
		}
		return strings.Compare(a.test, b.test)
	})
	n = min(n, len(times))
	fmt.Fprintf(out, "slowest %d of %d tests:\n", n, len(times))
	for _, t := range times[:n] {
		mark := ""
		if t.failed {
			mark = " (failed)"
		}
		fmt.Fprintf(out, "%8.1f s  %s %s%s\n", t.seconds, t.pkg, t.test, mark)
	}
}
