package pglog_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/pglog"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func newReader() *pglog.Reader { return &pglog.Reader{Key: testKey} }

// source is a log directory written by the test, with the records it holds
// in file order.
type source struct {
	node int
	dir  string
	recs []rec
	file string // the file being written
	n    int    // lines in it
}

func newSource(tb testing.TB, node int) *source {
	return &source{node: node, dir: tb.TempDir()}
}

// write appends records, rotating to a new file every perFile lines as
// the collector would (the new file named by the time of its first line).
func (s *source) write(tb testing.TB, perFile int, recs ...rec) {
	tb.Helper()
	for _, r := range recs {
		if s.file == "" || (perFile > 0 && s.n >= perFile) {
			s.rotate(r.ts)
		}
		appendLines(tb, s.dir, s.file, r)
		s.recs = append(s.recs, r)
		s.n++
	}
}

// rotate starts a new file named by t, as a size or time rotation (or
// pg_rotate_logfile) does.
func (s *source) rotate(t time.Time) {
	s.file, s.n = fileName(t), 0
}

func (s *source) src() pglog.Source { return pglog.Source{Node: s.node, Dir: s.dir} }

// readAll pages through everything q selects, checking the paging rules on
// the way: only the last page is short, and only it has no cursor.
func readAll(tb testing.TB, r *pglog.Reader, srcs []pglog.Source, q pglog.Query) []pglog.Entry {
	tb.Helper()
	var all []pglog.Entry
	for pages := 0; ; pages++ {
		if pages > 10000 {
			tb.Fatal("paging does not end")
		}
		p, err := r.Read(context.Background(), srcs, q)
		if err != nil {
			tb.Fatalf("page %d: %v", pages+1, err)
		}
		all = append(all, p.Entries...)
		limit := q.Limit
		if limit <= 0 {
			limit = pglog.MaxEntries
		}
		if p.Cursor == "" {
			return all
		}
		if len(p.Entries) != limit {
			tb.Fatalf("page %d has %d entries and a cursor; a page with a cursor is full (%d)", pages+1, len(p.Entries), limit)
		}
		q.Cursor = p.Cursor
	}
}

// want is the reference: each source's matching records newest first (the
// reverse of file order), merged by timestamp, lower node first on a tie.
func want(srcs []*source, keep func(rec) bool) []pglog.Entry {
	lists := make([][]pglog.Entry, len(srcs))
	for i, s := range srcs {
		for j := len(s.recs) - 1; j >= 0; j-- {
			if r := s.recs[j]; keep(r) {
				lists[i] = append(lists[i], pglog.Entry{Timestamp: r.ts.Truncate(time.Millisecond).UTC(), Severity: r.sev, Message: r.msg, Node: s.node})
			}
		}
	}
	var out []pglog.Entry
	for {
		best := -1
		for i, l := range lists {
			if len(l) == 0 {
				continue
			}
			if best < 0 || l[0].Timestamp.After(lists[best][0].Timestamp) ||
				(l[0].Timestamp.Equal(lists[best][0].Timestamp) && srcs[i].node < srcs[best].node) {
				best = i
			}
		}
		if best < 0 {
			return out
		}
		out = append(out, lists[best][0])
		lists[best] = lists[best][1:]
	}
}

func diffEntries(tb testing.TB, got, want []pglog.Entry) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Errorf("got %d entries, want %d", len(got), len(want))
	}
	for i := 0; i < len(got) && i < len(want); i++ {
		if g, w := got[i], want[i]; !g.Timestamp.Equal(w.Timestamp) || g.Severity != w.Severity || g.Message != w.Message || g.Node != w.Node {
			tb.Fatalf("entry %d:\n got %v [%s] %q node %d\nwant %v [%s] %q node %d", i, g.Timestamp, g.Severity, g.Message, g.Node, w.Timestamp, w.Severity, w.Message, w.Node)
		}
	}
}

// mixedRecs makes n records of every kind the filters tell apart: LOG
// statements, WARNINGs with terms, ERRORs with a statement, non-ASCII,
// escapes, DEBUG and FATAL, with timestamps a little out of order (less
// than Slack), as the collector writes them.
func mixedRecs(n, seed int) []rec {
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	out := make([]rec, n)
	for i := range out {
		ts := at(i*37 + rng.IntN(400) + seed)
		var r rec
		switch {
		case i%7 == 0:
			r = rec{ts: ts, sev: "WARNING", msg: fmt.Sprintf("Alpha beta warning %d from node %d", i, seed)}
		case i%11 == 0:
			r = rec{ts: ts, sev: "ERROR", msg: `relation "nope" does not exist`, statement: fmt.Sprintf("select * from nope -- alpha %d", i)}
		case i%13 == 0:
			r = rec{ts: ts, sev: "NOTICE", msg: fmt.Sprintf("ÄRGER im Büro %d", i)}
		case i%17 == 0:
			r = rec{ts: ts, sev: "DEBUG", msg: fmt.Sprintf("debug\ttab and\nnewline BETA %d", i)}
		case i%29 == 0:
			r = rec{ts: ts, sev: "FATAL", msg: `password authentication failed for user "alpha"`}
		default:
			r = rec{ts: ts, sev: "LOG", msg: fmt.Sprintf("duration: 0.%03d ms  statement: SELECT %d AS beta", i%1000, i)}
		}
		out[i] = r
	}
	return out
}

func TestReader_Read_Filters(t *testing.T) {
	a, b := newSource(t, 0), newSource(t, 1)
	a.write(t, 700, mixedRecs(3000, 0)...)
	b.write(t, 450, mixedRecs(2500, 5)...)
	// The collector's stderr file is no JSON and is not read.
	appendRaw(t, a.dir, "startup.log", "LOG:  ending log output to stderr\n")
	appendRaw(t, a.dir, "postgresql-2026-11-21_231917.log", "not json\n")
	srcs := []*source{a, b}
	since, until := at(20000), at(80000)
	has := func(s string, terms ...string) bool {
		for _, t := range terms {
			if !strings.Contains(strings.ToLower(s), strings.ToLower(t)) {
				return false
			}
		}
		return true
	}
	tests := []struct {
		name string
		q    pglog.Query
		keep func(rec) bool
	}{
		{"All", pglog.Query{}, func(rec) bool { return true }},
		{"Severity", pglog.Query{Severities: []string{"WARNING"}}, func(r rec) bool { return r.sev == "WARNING" }},
		{"SeveritiesAnyCase", pglog.Query{Severities: []string{"error", "Fatal"}}, func(r rec) bool { return r.sev == "ERROR" || r.sev == "FATAL" }},
		{"SeverityDebugLevel", pglog.Query{Severities: []string{"DEBUG3"}}, func(r rec) bool { return r.sev == "DEBUG" }},
		{"SearchEveryTerm", pglog.Query{Search: []string{"ALPHA", "Beta"}}, func(r rec) bool { return has(r.msg, "alpha", "beta") }},
		{"SearchMessageOnly", pglog.Query{Search: []string{"nope --"}}, func(r rec) bool { return false }},
		{"SearchQuote", pglog.Query{Search: []string{`"NOPE"`}}, func(r rec) bool { return has(r.msg, `"nope"`) }},
		{"SearchNonASCII", pglog.Query{Search: []string{"ärger IM büro"}}, func(r rec) bool { return has(r.msg, "ärger im büro") }},
		{"SearchEscaped", pglog.Query{Search: []string{"tab and\nnewline"}}, func(r rec) bool { return has(r.msg, "tab and\nnewline") }},
		{"SearchEmptyTerm", pglog.Query{Search: []string{""}}, func(rec) bool { return true }},
		{"Since", pglog.Query{Since: &since}, func(r rec) bool { return r.ts.After(since) }},
		{"Until", pglog.Query{Until: &until}, func(r rec) bool { return r.ts.Before(until) }},
		{"SinceUntil", pglog.Query{Since: &since, Until: &until}, func(r rec) bool { return r.ts.After(since) && r.ts.Before(until) }},
		{"Combined", pglog.Query{Since: &since, Until: &until, Severities: []string{"warning", "log"}, Search: []string{"BETA"}},
			func(r rec) bool {
				return r.ts.After(since) && r.ts.Before(until) && (r.sev == "WARNING" || r.sev == "LOG") && has(r.msg, "beta")
			}},
		{"NoMatch", pglog.Query{Search: []string{"zzz-never"}}, func(rec) bool { return false }},
	}
	for _, tt := range tests {
		for _, limit := range []int{0, 37} {
			t.Run(fmt.Sprintf("%s/limit%d", tt.name, limit), func(t *testing.T) {
				q := tt.q
				q.Limit = limit
				got := readAll(t, newReader(), []pglog.Source{a.src(), b.src()}, q)
				w := want(srcs, tt.keep)
				diffEntries(t, got, w)
			})
		}
	}
	t.Run("OneNode", func(t *testing.T) {
		got := readAll(t, newReader(), []pglog.Source{b.src()}, pglog.Query{Severities: []string{"WARNING"}})
		diffEntries(t, got, want([]*source{b}, func(r rec) bool { return r.sev == "WARNING" }))
	})
}

func TestReader_Read_Order(t *testing.T) {
	s := newSource(t, 0)
	s.write(t, 2, rec{ts: at(0), sev: "LOG", msg: "one"}, rec{ts: at(1), sev: "LOG", msg: "two"}, rec{ts: at(1000), sev: "LOG", msg: "three"})
	p, err := newReader().Read(context.Background(), []pglog.Source{s.src()}, pglog.Query{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range p.Entries {
		got = append(got, e.Message)
	}
	if strings.Join(got, ",") != "three,two,one" || p.Cursor != "" {
		t.Errorf("got %v, cursor %q; want three,two,one and no cursor", got, p.Cursor)
	}
	if e := p.Entries[0]; !e.Timestamp.Equal(at(1000)) || e.Timestamp.Location() != time.UTC || e.Severity != "LOG" {
		t.Errorf("entry = %+v, want timestamp %v UTC and severity LOG", e, at(1000))
	}
}

func TestReader_Read_PartialLine(t *testing.T) {
	s := newSource(t, 0)
	s.write(t, 0, rec{ts: at(0), sev: "LOG", msg: "complete"})
	// The collector is in the middle of writing the next line.
	next := jsonLine(rec{ts: at(1), sev: "WARNING", msg: "being written"})
	appendRaw(t, s.dir, s.file, next[:100])
	p, err := newReader().Read(context.Background(), []pglog.Source{s.src()}, pglog.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Entries) != 1 || p.Entries[0].Message != "complete" {
		t.Fatalf("with a partial last line: %+v, want only the complete line", p.Entries)
	}
	// Once complete, a new first page has it.
	appendRaw(t, s.dir, s.file, next[100:])
	p, err = newReader().Read(context.Background(), []pglog.Source{s.src()}, pglog.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Entries) != 2 || p.Entries[0].Message != "being written" {
		t.Errorf("after the line completes: %+v, want it first", p.Entries)
	}
}

func TestReader_Read_LongLines(t *testing.T) {
	s := newSource(t, 0)
	var recs []rec
	for i := range 40 {
		// Lines from a few bytes to several blocks (64 KiB and more).
		recs = append(recs, rec{ts: at(i), sev: "LOG", msg: fmt.Sprintf("%d:%s", i, strings.Repeat("x", (i*i*97)%300000))})
	}
	s.write(t, 15, recs...)
	got := readAll(t, newReader(), []pglog.Source{s.src()}, pglog.Query{Limit: 3})
	diffEntries(t, got, want([]*source{s}, func(rec) bool { return true }))
	got = readAll(t, newReader(), []pglog.Source{s.src()}, pglog.Query{Search: []string{"7:x"}, Limit: 1})
	diffEntries(t, got, want([]*source{s}, func(r rec) bool { return strings.Contains(r.msg, "7:x") }))
}

func TestReader_Read_SkipsGarbage(t *testing.T) {
	s := newSource(t, 0)
	s.write(t, 0, rec{ts: at(0), sev: "LOG", msg: "before"})
	appendRaw(t, s.dir, s.file, "not json at all\n\n{\"no\":\"timestamp\"}\n")
	s.write(t, 0, rec{ts: at(1), sev: "LOG", msg: "after"})
	got := readAll(t, newReader(), []pglog.Source{s.src()}, pglog.Query{Limit: 1})
	diffEntries(t, got, want([]*source{s}, func(rec) bool { return true }))
}

func TestReader_Read_CursorOnlyWhenOlderExists(t *testing.T) {
	tests := []struct {
		name       string
		lines      int
		wantCursor bool
	}{
		{"Fewer", 499, false},
		{"Exactly", 500, false},
		{"OneMore", 501, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSource(t, 0)
			for i := range tt.lines {
				s.write(t, 200, rec{ts: at(i), sev: "WARNING", msg: fmt.Sprintf("w%d", i)})
				s.write(t, 200, rec{ts: at(i), sev: "LOG", msg: "noise"})
			}
			p, err := newReader().Read(context.Background(), []pglog.Source{s.src()}, pglog.Query{Severities: []string{"WARNING"}})
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Cursor != ""; got != tt.wantCursor || len(p.Entries) != min(tt.lines, 500) {
				t.Errorf("%d matching lines: %d entries, cursor %v; want %d, %v", tt.lines, len(p.Entries), got, min(tt.lines, 500), tt.wantCursor)
			}
		})
	}
}

// TestReader_Read_PagingWhileWriting pages through 2,600 lines while a
// writer appends lines, leaves a partial line and rotates to new files
// between pages: every line present at the first page comes exactly once,
// in order, and no later line comes at all.
func TestReader_Read_PagingWhileWriting(t *testing.T) {
	for _, q := range []pglog.Query{{}, {Search: []string{"batch"}}, {Severities: []string{"warning"}}} {
		t.Run(fmt.Sprintf("%v%v", q.Search, q.Severities), func(t *testing.T) {
			a, b := newSource(t, 0), newSource(t, 1)
			n := 0
			batch := func(s *source, count int) {
				for range count {
					s.write(t, 900, rec{ts: at(n), sev: "WARNING", msg: fmt.Sprintf("batch line %d", n)})
					n++
				}
			}
			batch(a, 1300)
			batch(b, 1300)
			present := want([]*source{a, b}, func(rec) bool { return true })
			r := newReader()
			srcs := []pglog.Source{a.src(), b.src()}
			var got []pglog.Entry
			for page := 0; ; page++ {
				p, err := r.Read(context.Background(), srcs, q)
				if err != nil {
					t.Fatalf("page %d: %v", page+1, err)
				}
				got = append(got, p.Entries...)
				if p.Cursor == "" {
					break
				}
				q.Cursor = p.Cursor
				// Between pages: new lines, a rotation on one node, a
				// line being written on the other.
				batch(a, 50)
				switch page {
				case 0:
					a.rotate(at(n + 2000))
					batch(a, 10)
				case 1:
					appendRaw(t, b.dir, b.file, jsonLine(rec{ts: at(n), sev: "WARNING", msg: "batch partial"})[:50])
				case 2:
					b.rotate(at(n + 4000))
					batch(b, 10)
					a.rotate(at(n + 6000))
				}
			}
			diffEntries(t, got, present)
		})
	}
}

// TestReader_Read_Merge reads two nodes whose lines interleave in time.
func TestReader_Read_Merge(t *testing.T) {
	a, b := newSource(t, 0), newSource(t, 2)
	for i := range 1200 {
		a.write(t, 300, rec{ts: at(2 * i), sev: "LOG", msg: fmt.Sprintf("a%d", i)})
		b.write(t, 500, rec{ts: at(2*i + i%3), sev: "LOG", msg: fmt.Sprintf("b%d", i)})
	}
	got := readAll(t, newReader(), []pglog.Source{a.src(), b.src()}, pglog.Query{Limit: 250})
	diffEntries(t, got, want([]*source{a, b}, func(rec) bool { return true }))
	for i := 1; i < len(got); i++ {
		if got[i].Timestamp.After(got[i-1].Timestamp) {
			t.Fatalf("entry %d (%v) is newer than entry %d (%v)", i, got[i].Timestamp, i-1, got[i-1].Timestamp)
		}
	}
	nodes := map[int]int{}
	for _, e := range got {
		nodes[e.Node]++
	}
	if nodes[0] != 1200 || nodes[2] != 1200 {
		t.Errorf("entries per node = %v, want 1200 of nodes 0 and 2", nodes)
	}
}

// TestReader_Read_NewSource: a node that had no lines when the cursor was
// made adds none to later pages (its lines are all newer).
func TestReader_Read_NewSource(t *testing.T) {
	a, b := newSource(t, 0), newSource(t, 1)
	a.write(t, 0, mixedRecs(30, 0)...)
	p, err := newReader().Read(context.Background(), []pglog.Source{a.src(), b.src()}, pglog.Query{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	b.write(t, 0, rec{ts: at(0), sev: "LOG", msg: "late node"})
	got := readAll(t, newReader(), []pglog.Source{a.src(), b.src()}, pglog.Query{Limit: 10, Cursor: p.Cursor})
	diffEntries(t, append(p.Entries, got...), want([]*source{a}, func(rec) bool { return true }))
}

// TestReader_Read_SkipsFilesByUntil: a file whose name is later than Until
// (plus Slack) is not read. Its line here claims an earlier time, which
// the collector never writes, to show that the file is not opened.
func TestReader_Read_SkipsFilesByUntil(t *testing.T) {
	s := newSource(t, 0)
	s.write(t, 0, rec{ts: t0, sev: "LOG", msg: "old"})
	s.rotate(t0.Add(time.Hour))
	s.write(t, 0, rec{ts: t0.Add(time.Minute), sev: "LOG", msg: "in a newer file"})
	p, err := newReader().Read(context.Background(), []pglog.Source{s.src()}, pglog.Query{Until: timePtr(t0.Add(30 * time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Entries) != 1 || p.Entries[0].Message != "old" {
		t.Errorf("until before the newer file: %+v, want only old", p.Entries)
	}
}

// TestReader_Read_StopsAtSince: the scan ends at the first line below Since
// by more than Slack and reads no older file. The older file here holds a
// line that claims a later time, which the collector never writes, to show
// that it is not read.
func TestReader_Read_StopsAtSince(t *testing.T) {
	s := newSource(t, 0)
	since := t0.Add(time.Hour)
	s.rotate(t0)
	s.write(t, 0, rec{ts: since.Add(time.Millisecond), sev: "LOG", msg: "in an older file"})
	s.rotate(since.Add(-10 * time.Second))
	for i := range 3000 {
		s.write(t, 0, rec{ts: since.Add(-10*time.Second + time.Duration(i)*4*time.Millisecond), sev: "LOG", msg: fmt.Sprintf("new %d", i)})
	}
	got := readAll(t, newReader(), []pglog.Source{s.src()}, pglog.Query{Since: &since, Limit: 100})
	if len(got) != 499 {
		t.Errorf("since: %d entries, want 499 (the lines of the last 2 s)", len(got))
	}
	for _, e := range got {
		if !e.Timestamp.After(since) || e.Message == "in an older file" {
			t.Errorf("entry %v %q: at or before since, or from the older file", e.Timestamp, e.Message)
		}
	}
}

func TestReader_Read_Errors(t *testing.T) {
	s := newSource(t, 0)
	for i := range 30 {
		s.write(t, 10, rec{ts: at(i * 1000), sev: "LOG", msg: fmt.Sprintf("line %d", i)})
	}
	r := newReader()
	srcs := []pglog.Source{s.src()}
	p, err := r.Read(context.Background(), srcs, pglog.Query{Limit: 5, Scope: "svc/all"})
	if err != nil || p.Cursor == "" {
		t.Fatalf("first page: %v, cursor %q", err, p.Cursor)
	}
	tampered := []byte(p.Cursor)
	tampered[3] ^= 1
	tests := []struct {
		name   string
		r      *pglog.Reader
		q      pglog.Query
		phrase string
	}{
		{"ErrGarbage", r, pglog.Query{Cursor: "garbage", Scope: "svc/all"}, "malformed"},
		{"ErrNotBase64", r, pglog.Query{Cursor: "!!!", Scope: "svc/all"}, "malformed"},
		{"ErrTampered", r, pglog.Query{Cursor: string(tampered), Scope: "svc/all"}, "not issued"},
		{"ErrOtherKey", &pglog.Reader{Key: []byte("another key of thirty-two bytes!")}, pglog.Query{Cursor: p.Cursor, Scope: "svc/all"}, "not issued"},
		{"ErrOtherScope", r, pglog.Query{Cursor: p.Cursor, Scope: "other/all"}, "not issued"},
		{"ErrSeverity", r, pglog.Query{Severities: []string{"WARN"}}, "not a PostgreSQL severity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.r.Read(context.Background(), srcs, tt.q)
			var e *dbcloud.Error
			if !errors.As(err, &e) || e.Kind != dbcloud.KindInvalid || !strings.Contains(e.Message, tt.phrase) {
				t.Errorf("err = %v, want an invalid error saying %q", err, tt.phrase)
			}
		})
	}
	t.Run("ErrExpired", func(t *testing.T) {
		// Two pages of 5 lines: the cursor points into the second newest
		// file, then retention removes it and the oldest.
		q := pglog.Query{Scope: "svc/all", Limit: 5}
		for range 2 {
			p, err := r.Read(context.Background(), srcs, q)
			if err != nil {
				t.Fatal(err)
			}
			q.Cursor = p.Cursor
		}
		files, _ := filepath.Glob(filepath.Join(s.dir, "*.json"))
		sort.Strings(files)
		for _, f := range files[:len(files)-1] {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		_, err := r.Read(context.Background(), srcs, q)
		var e *dbcloud.Error
		if !errors.As(err, &e) || e.Kind != dbcloud.KindInvalid || !strings.Contains(e.Message, "expired") {
			t.Errorf("err = %v, want an invalid error saying the cursor expired", err)
		}
	})
	t.Run("ErrCanceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := r.Read(ctx, srcs, pglog.Query{}); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	})
	t.Run("ErrShortKey", func(t *testing.T) {
		if _, err := (&pglog.Reader{Key: []byte("short")}).Read(context.Background(), srcs, pglog.Query{}); err == nil {
			t.Error("a short key was accepted")
		}
	})
}

func TestReader_Read_MissingDir(t *testing.T) {
	p, err := newReader().Read(context.Background(), []pglog.Source{{Node: 0, Dir: filepath.Join(t.TempDir(), "nope")}}, pglog.Query{})
	if err != nil || len(p.Entries) != 0 || p.Cursor != "" {
		t.Errorf("missing directory: %+v, %v; want an empty page", p, err)
	}
}

// TestReader_Read_SkipsLinksAndFIFOs: a symlink (to a file of someone
// else) and a FIFO named like the newest log files are skipped; the
// collector's files are read as ever.
func TestReader_Read_SkipsLinksAndFIFOs(t *testing.T) {
	s := newSource(t, 0)
	s.write(t, 1, rec{ts: at(0), sev: "LOG", msg: "one"}, rec{ts: at(1000), sev: "LOG", msg: "two"})
	other := t.TempDir()
	appendLines(t, other, "secret.json", rec{ts: at(2000), sev: "LOG", msg: "secret"})
	if err := os.Symlink(filepath.Join(other, "secret.json"), filepath.Join(s.dir, fileName(at(2000)))); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(s.dir, fileName(at(3000))), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := newReader().Read(ctx, []pglog.Source{s.src()}, pglog.Query{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range p.Entries {
		got = append(got, e.Message)
	}
	if strings.Join(got, ",") != "two,one" {
		t.Errorf("got %v, want two,one (the link and the FIFO skipped)", got)
	}
}
