package pglog

import (
	"bytes"
	"strings"
	"time"
	"unicode"

	"dbcloud"
)

// severityNames maps what a client may ask for to what PostgreSQL writes in
// error_severity (elog.c error_severity(): every DEBUGn level is "DEBUG").
var severityNames = map[string]string{
	"DEBUG": "DEBUG", "DEBUG1": "DEBUG", "DEBUG2": "DEBUG", "DEBUG3": "DEBUG", "DEBUG4": "DEBUG", "DEBUG5": "DEBUG",
	"LOG": "LOG", "INFO": "INFO", "NOTICE": "NOTICE", "WARNING": "WARNING", "ERROR": "ERROR", "FATAL": "FATAL", "PANIC": "PANIC",
}

// span is a line of a block: [start, end), end just past its '\n'.
type span struct{ start, end int }

// verdict is what a filter says of one line.
type verdict int

const (
	skipped verdict = iota
	matched
	// tooOld: the line is below Since by more than Slack, so no older line
	// can match and the source is done.
	tooOld
)

// filter is a Query's filters, compiled for raw lines.
type filter struct {
	since, until *time.Time
	stopBelow    time.Time // since - Slack

	sevs       map[string]bool // nil: any severity
	sevNeedles [][]byte        // `"error_severity":"WARNING"` per severity

	terms  []string      // every search term, folded
	needle []*foldNeedle // the terms a raw line can be searched for
	anchor *foldNeedle   // the longest of them, searched across whole blocks

	// red rewrites the host paths of a message before the search terms
	// see it, so a term finds only what the page shows: a search for a
	// host path never tells whether a line holds it.
	red *Redactor
}

func newFilter(q Query, red *Redactor) (*filter, error) {
	f := &filter{since: q.Since, until: q.Until, red: red}
	if f.since != nil {
		f.stopBelow = f.since.Add(-Slack)
	}
	for _, s := range q.Severities {
		if s == "" {
			continue
		}
		name, ok := severityNames[strings.ToUpper(s)]
		if !ok {
			return nil, dbcloud.Errorf(dbcloud.KindInvalid,
				"severity %q is not a PostgreSQL severity; use DEBUG, LOG, INFO, NOTICE, WARNING, ERROR, FATAL or PANIC.", s)
		}
		if f.sevs == nil {
			f.sevs = map[string]bool{}
		}
		if !f.sevs[name] {
			f.sevs[name] = true
			f.sevNeedles = append(f.sevNeedles, []byte(`"error_severity":"`+name+`"`))
		}
	}
	for _, t := range q.Search {
		if t == "" {
			continue
		}
		ft := fold(t)
		f.terms = append(f.terms, ft)
		if rawSearchable(ft) && !red.hides(ft) {
			n := newFoldNeedle(ft)
			f.needle = append(f.needle, n)
			if f.anchor == nil || len(n.pat) > len(f.anchor.pat) {
				f.anchor = n
			}
		}
	}
	return f, nil
}

// candidates appends to out the lines of block that may match, oldest
// first. With a search term or a single severity it searches the whole
// block for those bytes, as grep does, instead of looking at every line.
func (f *filter) candidates(block []byte, out []span) []span {
	switch {
	case f.anchor != nil:
		fd := finder{n: f.anchor, data: block, lo: -1, up: -1}
		for from := 0; ; {
			i := fd.next(from)
			if i < 0 {
				return out
			}
			sp := lineAt(block, i)
			out = append(out, sp)
			from = sp.end
		}
	case len(f.sevNeedles) == 1:
		pat := f.sevNeedles[0]
		for from := 0; ; {
			i := bytes.Index(block[from:], pat)
			if i < 0 {
				return out
			}
			sp := lineAt(block, from+i)
			out = append(out, sp)
			from = sp.end
		}
	default:
		for start := 0; start < len(block); {
			end := bytes.IndexByte(block[start:], '\n')
			if end < 0 {
				end = len(block) - start - 1 // the block always ends with '\n'
			}
			end += start + 1
			out = append(out, span{start, end})
			start = end
		}
		return out
	}
}

// lineAt returns the line of block holding byte i.
func lineAt(block []byte, i int) span {
	start := bytes.LastIndexByte(block[:i], '\n') + 1
	end := bytes.IndexByte(block[i:], '\n')
	if end < 0 {
		return span{start, len(block)}
	}
	return span{start, i + end + 1}
}

// belowSince reports whether the first line of block is below Since by
// more than Slack: lines before it are older still, so the scan ends with
// this block.
func (f *filter) belowSince(block []byte) bool {
	if f.since == nil {
		return false
	}
	first := block
	if i := bytes.IndexByte(block, '\n'); i >= 0 {
		first = block[:i]
	}
	ts, ok := rawTimestamp(first)
	return ok && ts.Before(f.stopBelow)
}

// record is the part of a jsonlog line a page shows.
type record struct {
	Timestamp string `json:"timestamp"`
	Severity  string `json:"error_severity"`
	Message   string `json:"message"`
	User      string `json:"user"`
}

// match decides on one line (with its '\n'): cheap byte checks first, then
// decoding, then the exact checks on the decoded fields. A line that is not
// a JSON object with a timestamp is skipped.
func (f *filter) match(line []byte) (Entry, verdict) {
	if f.sevs != nil && !containsAny(line, f.sevNeedles) {
		return Entry{}, skipped
	}
	for _, n := range f.needle {
		if n != f.anchor && !n.in(line) {
			return Entry{}, skipped
		}
	}
	timed := false
	if f.since != nil || f.until != nil {
		if ts, ok := rawTimestamp(line); ok {
			if v := f.checkTime(ts); v != matched {
				return Entry{}, v
			}
			timed = true
		}
	}
	var rec record
	if err := decodeRecord(line, &rec); err != nil {
		return Entry{}, skipped
	}
	ts, err := parseTimestamp(rec.Timestamp)
	if err != nil {
		return Entry{}, skipped
	}
	if !timed {
		if v := f.checkTime(ts); v != matched {
			return Entry{}, v
		}
	}
	if f.sevs != nil && !f.sevs[rec.Severity] {
		return Entry{}, skipped
	}
	rec.Message = f.red.Redact(rec.Message)
	if len(f.terms) > 0 {
		msg := fold(rec.Message)
		for _, t := range f.terms {
			if !strings.Contains(msg, t) {
				return Entry{}, skipped
			}
		}
	}
	return Entry{Timestamp: ts, Severity: rec.Severity, Message: rec.Message, User: rec.User}, matched
}

func (f *filter) checkTime(ts time.Time) verdict {
	if f.since != nil {
		if ts.Before(f.stopBelow) {
			return tooOld
		}
		if !ts.After(*f.since) {
			return skipped
		}
	}
	if f.until != nil && !ts.Before(*f.until) {
		return skipped
	}
	return matched
}

func containsAny(line []byte, pats [][]byte) bool {
	for _, p := range pats {
		if bytes.Contains(line, p) {
			return true
		}
	}
	return false
}

// tsLayout is how jsonlog writes timestamps with log_timezone = UTC
// ("2026-11-21 23:19:17.095 UTC").
const tsLayout = "2006-01-02 15:04:05.000 MST"

// rawTimestamp reads the timestamp of a line without decoding it: jsonlog
// always writes it first.
func rawTimestamp(line []byte) (time.Time, bool) {
	const prefix = `{"timestamp":"`
	if !bytes.HasPrefix(line, []byte(prefix)) {
		return time.Time{}, false
	}
	rest := line[len(prefix):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return time.Time{}, false
	}
	ts, err := parseTimestamp(string(rest[:end]))
	return ts, err == nil
}

// parseTimestamp parses a jsonlog timestamp; the UTC form, which dbcloud
// configures, without time.Parse, since a scan may parse many.
func parseTimestamp(s string) (time.Time, error) {
	if len(s) == 27 && s[4] == '-' && s[7] == '-' && s[10] == ' ' && s[13] == ':' && s[16] == ':' && s[19] == '.' && s[23:] == " UTC" {
		n := func(i, j int) int {
			v := 0
			for ; i < j; i++ {
				c := s[i] - '0'
				if c > 9 {
					return -1
				}
				v = v*10 + int(c)
			}
			return v
		}
		y, mo, d, h, mi, sec, ms := n(0, 4), n(5, 7), n(8, 10), n(11, 13), n(14, 16), n(17, 19), n(20, 23)
		if y >= 0 && mo >= 1 && mo <= 12 && d >= 1 && d <= 31 && h >= 0 && h < 24 && mi >= 0 && mi < 60 && sec >= 0 && sec < 61 && ms >= 0 {
			return time.Date(y, time.Month(mo), d, h, mi, sec, ms*int(time.Millisecond), time.UTC), nil
		}
	}
	t, err := time.Parse(tsLayout, s)
	if err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}

// fold lowers s for case-insensitive search. A non-ASCII letter whose lower
// case is ASCII (the Kelvin sign, dotted capital I) is kept as it is, so
// that an ASCII term matches a message only where the raw line holds it in
// ASCII: the byte search over raw lines then never misses a match.
func fold(s string) string {
	upper := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8RuneSelf {
			return strings.Map(func(r rune) rune {
				if l := unicode.ToLower(r); r < utf8RuneSelf || l >= utf8RuneSelf {
					return l
				}
				return r
			}, s)
		}
		if 'A' <= c && c <= 'Z' {
			upper = true
		}
	}
	if !upper {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		b[i] = lowerASCII[c]
	}
	return string(b)
}

const utf8RuneSelf = 0x80

// rawSearchable reports whether a folded term appears byte for byte in a
// raw jsonlog line wherever the message holds it: it is ASCII, and
// PostgreSQL's escape_json leaves every byte of it as it is (we are also
// wary of the HTML escapes other JSON writers use).
func rawSearchable(t string) bool {
	for i := 0; i < len(t); i++ {
		c := t[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

var lowerASCII = func() (t [256]byte) {
	for i := range t {
		t[i] = byte(i)
		if 'A' <= i && i <= 'Z' {
			t[i] = byte(i + 'a' - 'A')
		}
	}
	return t
}()

// byteRank says how rare a byte is in jsonlog lines (higher is rarer),
// from the order below, most frequent first; letters count for both cases.
// Searching for a term's rarest byte keeps false starts few.
var byteRank = func() (r [256]uint8) {
	const common = " e\"t:a,o_sin0r1l2dcu-3p5m4h6789g.y/bfwvk()x{}=jq*z;'$@#%!?+[]|~^`"
	for i := range r {
		r[i] = 255
	}
	for i := 0; i < len(common); i++ {
		r[common[i]] = uint8(i)
		if c := common[i]; 'a' <= c && c <= 'z' {
			r[c-'a'+'A'] = uint8(i)
		}
	}
	return r
}()

// foldNeedle is a folded ASCII term searched in raw bytes regardless of
// ASCII case.
type foldNeedle struct {
	pat    []byte
	rare   int  // index in pat of its rarest byte
	lo, up byte // that byte in lower and upper case (equal when not a letter)
}

func newFoldNeedle(t string) *foldNeedle {
	n := &foldNeedle{pat: []byte(t)}
	for i, c := range n.pat {
		if byteRank[c] > byteRank[n.pat[n.rare]] {
			n.rare = i
		}
	}
	n.lo = n.pat[n.rare]
	n.up = n.lo
	if 'a' <= n.lo && n.lo <= 'z' {
		n.up = n.lo - 'a' + 'A'
	}
	return n
}

// in reports whether the needle occurs in b.
func (n *foldNeedle) in(b []byte) bool {
	fd := finder{n: n, data: b, lo: -1, up: -1}
	return fd.next(0) >= 0
}

// finder searches one buffer for a needle. It remembers where each case
// of the rare byte next occurs, so the buffer is scanned (by the
// vectorized bytes.IndexByte) once per case, however many false starts.
type finder struct {
	n      *foldNeedle
	data   []byte
	lo, up int // next index of n.lo and n.up, len(data) if none; -1 unknown
}

// next returns the first index at or after from where the needle occurs,
// or -1.
func (fd *finder) next(from int) int {
	n, data := fd.n, fd.data
	for {
		p := from + n.rare
		if p >= len(data) {
			return -1
		}
		if fd.lo < p {
			fd.lo = indexByteFrom(data, n.lo, p)
		}
		c := fd.lo
		if n.up != n.lo {
			if fd.up < p {
				fd.up = indexByteFrom(data, n.up, p)
			}
			c = min(c, fd.up)
		}
		s := c - n.rare
		if c >= len(data) || s+len(n.pat) > len(data) {
			return -1
		}
		if equalFoldASCII(data[s:s+len(n.pat)], n.pat) {
			return s
		}
		from = s + 1
	}
}

func indexByteFrom(b []byte, c byte, from int) int {
	i := bytes.IndexByte(b[from:], c)
	if i < 0 {
		return len(b)
	}
	return from + i
}

// equalFoldASCII reports whether b equals the lower-case pat, ignoring
// ASCII case.
func equalFoldASCII(b, pat []byte) bool {
	for i, c := range pat {
		if lowerASCII[b[i]] != c {
			return false
		}
	}
	return true
}
