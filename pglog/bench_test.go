package pglog_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"dbcloud/pglog"
)

// The benchmark data: 1,000,000 jsonlog lines of about 460 bytes (what
// runtime-notes.md section 5 measured with log_min_duration_statement=0),
// rotated at 100 MB like an instance's log_rotation_size. One line in
// 10,000 holds benchRare. The data is made once and kept in the temporary
// directory, so later runs reuse it; PGLOG_BENCH_DIR puts it elsewhere.
// -short makes 20,000 lines (in a directory of their own), enough to
// check the benchmarks run.
const (
	benchRare  = "rare-needle-7q"
	benchEvery = 10_000
	benchFile  = 100 << 20
)

// benchLines is the number of lines of the benchmark data.
func benchLines() int {
	if testing.Short() {
		return 20_000
	}
	return 1_000_000
}

var benchData = sync.OnceValues(func() (string, error) {
	dir := os.Getenv("PGLOG_BENCH_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "pglog-bench-1m-v4")
		if testing.Short() {
			dir = filepath.Join(os.TempDir(), "pglog-bench-20k-v4")
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "complete")); err == nil {
		return dir, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	start := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	var (
		f    *os.File
		w    *bufio.Writer
		size int
	)
	closeFile := func() error {
		if f == nil {
			return nil
		}
		if err := w.Flush(); err != nil {
			return err
		}
		return f.Close()
	}
	tables := []string{"conditions", "metrics", "orders", "users", "events"}
	for i := range benchLines() {
		ts := start.Add(time.Duration(i) * 86 * time.Millisecond)
		if f == nil || size >= benchFile {
			if err := closeFile(); err != nil {
				return "", err
			}
			var err error
			if f, err = os.Create(filepath.Join(dir, fileName(ts))); err != nil {
				return "", err
			}
			w, size = bufio.NewWriterSize(f, 1<<20), 0
		}
		t := tables[i%len(tables)]
		var r rec
		switch {
		case i%benchEvery == benchEvery/2:
			r = rec{ts: ts, sev: "WARNING", msg: fmt.Sprintf("%s: disk usage of tablespace for %s at %d%%", benchRare, t, 80+i%20)}
		case i%97 == 0:
			r = rec{ts: ts, sev: "ERROR", msg: fmt.Sprintf(`duplicate key value violates unique constraint "%s_pkey"`, t),
				statement: fmt.Sprintf("INSERT INTO %s (id, time, value) VALUES (%d, now(), %d)", t, i, i%1000)}
		default:
			r = rec{ts: ts, sev: "LOG", msg: fmt.Sprintf("duration: %d.%03d ms  statement: SELECT avg(value) FROM %s WHERE id = %d",
				i%50, i%1000, t, i%5000)}
		}
		l := jsonLine(r)
		if _, err := w.WriteString(l); err != nil {
			return "", err
		}
		size += len(l)
	}
	if err := closeFile(); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "complete"), nil, 0o644)
})

func benchSource(b *testing.B) []pglog.Source {
	b.Helper()
	dir, err := benchData()
	if err != nil {
		b.Fatal(err)
	}
	return []pglog.Source{{Node: 0, Dir: dir}}
}

// BenchmarkFirstPage reads the newest 500 lines, no filter.
func BenchmarkFirstPage(b *testing.B) {
	srcs := benchSource(b)
	r := newReader()
	for b.Loop() {
		p, err := r.Read(context.Background(), srcs, pglog.Query{})
		if err != nil || len(p.Entries) != pglog.MaxEntries || p.Cursor == "" {
			b.Fatalf("first page: %d entries, cursor %q, %v", len(p.Entries), p.Cursor, err)
		}
	}
}

// BenchmarkSearchRare searches for a term in 1 line of 10,000: 100
// matches, so the page is short and the whole 460 MB is scanned.
func BenchmarkSearchRare(b *testing.B) {
	srcs := benchSource(b)
	r := newReader()
	for b.Loop() {
		p, err := r.Read(context.Background(), srcs, pglog.Query{Search: []string{benchRare}})
		if err != nil || len(p.Entries) != benchLines()/benchEvery || p.Cursor != "" {
			b.Fatalf("search: %d entries, cursor %q, %v", len(p.Entries), p.Cursor, err)
		}
	}
}

// tacGrep runs `tac FILES | grep -m 500 TERM` over the benchmark data,
// newest file first: the baseline of the issue.
func tacGrep(b *testing.B, term string, wantLines int) {
	dir := benchSource(b)[0].Dir
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	sort.Sort(sort.Reverse(sort.StringSlice(files)))
	script := "tac " + strings.Join(files, " ") + " | grep -m 500 " + term
	for b.Loop() {
		out, err := exec.Command("sh", "-c", script).Output()
		if err != nil {
			b.Fatalf("%s: %v", script, err)
		}
		if n := strings.Count(string(out), "\n"); n != wantLines {
			b.Fatalf("%s: %d lines, want %d", script, n, wantLines)
		}
	}
}

// BenchmarkTacGrepFirstPage is the baseline of BenchmarkFirstPage: the
// term is in every line, so grep prints the newest 500.
func BenchmarkTacGrepFirstPage(b *testing.B) { tacGrep(b, "timestamp", 500) }

// BenchmarkTacGrepRare is the baseline of BenchmarkSearchRare.
func BenchmarkTacGrepRare(b *testing.B) { tacGrep(b, benchRare, benchLines()/benchEvery) }

// BenchmarkSearchRareWords is BenchmarkSearchRare with a term of common
// lower-case words in mixed case: its rarest byte is a letter, searched for
// in both cases, with more false starts than the needle's 'q'.
func BenchmarkSearchRareWords(b *testing.B) {
	srcs := benchSource(b)
	r := newReader()
	for b.Loop() {
		p, err := r.Read(context.Background(), srcs, pglog.Query{Search: []string{"Usage Of Tablespace"}})
		if err != nil || len(p.Entries) != benchLines()/benchEvery || p.Cursor != "" {
			b.Fatalf("search: %d entries, cursor %q, %v", len(p.Entries), p.Cursor, err)
		}
	}
}
