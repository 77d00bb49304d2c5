// Package pglog serves the JSON logs (log_destination = 'jsonlog') that
// PostgreSQL 15 instances write, newest first, in pages with an opaque cursor.
//
// It relies on what the logging collector guarantees (runtime-notes.md
// section 5): one JSON object per line, files named by the time they were
// opened (postgresql-YYYY-MM-DD_HHMMSS.json, so names sort in time order),
// written append-only, and never written again once rotated. A position in
// the logs is therefore a (file, byte offset) pair that stays valid until
// retention removes the file, and a cursor made of such positions lets
// paging visit every line exactly once while new lines are written and files
// rotate: lines written after the first page are behind every position the
// cursor holds, so they are never read by a later page.
//
// Files are read backward in blocks. Filters run on raw bytes first (a
// case-folded substring search across the whole block, or the exact
// `"error_severity":"WARNING"` bytes), and only the lines that pass are
// decoded, which keeps a rare search close to the speed of grep.
package pglog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"dbcloud/internal/tenantfs"
)

// MaxEntries is the page size when Query.Limit is not set; it is the limit
// decisions.md section 8 gives the logs endpoint.
const MaxEntries = 500

// Slack is how far out of time order the logging collector may write a line:
// it writes lines in the order they reach its pipe, which is only roughly
// the order of their timestamps. Scans stop at Since minus Slack and skip
// files by name at Until plus Slack.
const Slack = time.Second

// Source is one PostgreSQL instance's log directory (log_directory).
type Source struct {
	// Node identifies the instance in entries and cursors: 0 is the
	// primary, then replicas in order.
	Node int
	Dir  string
}

// Query selects and pages log entries. Filters combine with AND.
type Query struct {
	// Cursor is Page.Cursor of the previous page; empty for the newest page.
	Cursor string
	// Scope names what a cursor belongs to, such as a service ID and a node
	// filter. It is signed into the cursor, so a cursor of another service
	// or of another node filter is refused rather than read against files
	// it does not describe.
	Scope string
	// Since and Until are exclusive bounds on an entry's timestamp.
	Since, Until *time.Time
	// Severities keeps entries of any of these severities (case-insensitive;
	// DEBUG1 to DEBUG5 mean DEBUG, which is what PostgreSQL writes for them).
	// An unknown severity is an invalid query.
	Severities []string
	// Search keeps entries whose message contains every term,
	// case-insensitively. Only the message is searched, never detail,
	// hint or statement, because the message is what a page shows: an
	// entry found by a term always shows that term. Empty terms are ignored.
	Search []string
	// Limit is the most entries a page holds; MaxEntries when 0 or less.
	Limit int
}

// Entry is one log line.
type Entry struct {
	// Timestamp is the line's time (millisecond precision), in UTC.
	Timestamp time.Time
	// Severity is error_severity as PostgreSQL writes it: LOG, WARNING,
	// ERROR, ... in upper case.
	Severity string
	Message  string
	Node     int
	// User is the role the session logged in as (jsonlog's "user"), which
	// the session cannot change: empty for lines of no session. It tells
	// a login's own "connection authorized" line from a session's RAISE
	// of the same words.
	User string
}

// Page is entries newest first, merged across sources by timestamp.
type Page struct {
	Entries []Entry
	// Cursor reads the next, older page. It is empty exactly when no older
	// entry matches the query: the reader has found one before saying so.
	Cursor string
}

// Reader reads pages of log entries.
type Reader struct {
	// Key signs cursors (HMAC-SHA256), so a client can neither forge a
	// position nor point the reader at another file. It must stay the same
	// across restarts for cursors to outlive them; at least 16 bytes.
	Key []byte
	// Redact, when set, rewrites the host paths of every message read,
	// before the search terms are matched (see Redactor).
	Redact *Redactor
}

// Read returns the page of entries of sources that q selects. A malformed,
// altered, foreign or expired cursor and an unknown severity are errors of
// kind dbcloud.KindInvalid whose message says what was wrong.
func (r *Reader) Read(ctx context.Context, sources []Source, q Query) (*Page, error) {
	if len(r.Key) < 16 {
		return nil, errors.New("pglog: the cursor key must be at least 16 bytes")
	}
	f, err := newFilter(q, r.Redact)
	if err != nil {
		return nil, err
	}
	limit := q.Limit
	if limit <= 0 {
		limit = MaxEntries
	}
	var starts map[int]position
	if q.Cursor != "" {
		if starts, err = decodeCursor(r.Key, q.Scope, q.Cursor); err != nil {
			return nil, err
		}
	}
	its := make([]*sourceIter, 0, len(sources))
	defer func() {
		for _, it := range its {
			it.close()
		}
	}()
	seen := map[int]bool{}
	for _, s := range sources {
		if seen[s.Node] {
			return nil, fmt.Errorf("pglog: node %d is given twice", s.Node)
		}
		seen[s.Node] = true
		var start *position
		if starts != nil {
			p, ok := starts[s.Node]
			if !ok {
				// The cursor holds no position for this source: it had no
				// older matching line when the cursor was made (or did not
				// exist yet), so everything it has now is newer.
				continue
			}
			start = &p
		}
		it, err := openSource(s, start, f)
		if err != nil {
			return nil, err
		}
		its = append(its, it)
		if err := it.advance(ctx); err != nil {
			return nil, err
		}
	}
	page := &Page{Entries: make([]Entry, 0, min(limit, 64))}
	for len(page.Entries) < limit {
		best := newest(its)
		if best == nil {
			break
		}
		page.Entries = append(page.Entries, best.head.entry)
		if err := best.advance(ctx); err != nil {
			return nil, err
		}
	}
	var next []position
	for _, it := range its {
		if it.head != nil {
			next = append(next, position{Node: it.src.Node, File: it.head.file, Offset: it.head.end})
		}
	}
	if len(next) > 0 {
		page.Cursor = encodeCursor(r.Key, q.Scope, next)
	}
	return page, nil
}

// newest returns the source whose next entry is the newest, the lowest node
// on a tie so that pages are deterministic; nil when all are exhausted.
func newest(its []*sourceIter) *sourceIter {
	var best *sourceIter
	for _, it := range its {
		if it.head == nil {
			continue
		}
		if best == nil || it.head.entry.Timestamp.After(best.head.entry.Timestamp) ||
			(it.head.entry.Timestamp.Equal(best.head.entry.Timestamp) && it.src.Node < best.src.Node) {
			best = it
		}
	}
	return best
}

// logFile is a *.json file of a log directory.
type logFile struct {
	name string
	// opened is the time in the file's name (when the collector opened it),
	// zero when the name does not carry one.
	opened time.Time
}

// listFiles returns the *.json files of dir, oldest first. The collector's
// stderr file (startup.log, postgresql-*.log) is not JSON and is left out.
// A missing directory has no files: an instance that never started.
func listFiles(dir string) ([]logFile, error) {
	// The directory itself must be one, not a symlink to somewhere else.
	if fi, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("list log files: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("list log files: %s is not a directory", dir)
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("list log files: %w", err)
	}
	var files []logFile
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		files = append(files, logFile{name: e.Name(), opened: nameTime(e.Name())})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	return files, nil
}

// errNotRegular is what openRegular answers for a symlink, a FIFO, a
// device or a directory where a log file should be.
var errNotRegular = errors.New("not a regular file")

// openRegular opens path for reading only if it is a regular file. A log
// directory is writable by the server's OS user, so a tenant who got a
// shell could put a symlink there (to make dbcloud read, and show, a file
// of another service or of the host) or a FIFO (to make it hang): the file
// is opened through tenantfs, the one way root opens a file in such a
// directory, and what it refuses is errNotRegular to the reader, which
// skips it.
func openRegular(path string) (*os.File, error) {
	f, err := tenantfs.Open(path)
	if errors.Is(err, tenantfs.ErrSymlink) || errors.Is(err, tenantfs.ErrNotRegular) {
		return nil, fmt.Errorf("%w: %w", errNotRegular, err)
	}
	return f, err
}

// nameTime parses the time of a name made by
// log_filename = 'postgresql-%Y-%m-%d_%H%M%S.log' with log_timezone = UTC.
func nameTime(name string) time.Time {
	s := strings.TrimSuffix(strings.TrimPrefix(name, "postgresql-"), ".json")
	t, err := time.Parse("2006-01-02_150405", s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// validFileName reports whether name can be a log file of a directory: the
// cursor names files, and nothing it names may leave the directory.
func validFileName(name string) bool {
	return strings.HasSuffix(name, ".json") && filepath.Base(name) == name &&
		name != "." && name != ".." && !strings.ContainsAny(name, `/\`)
}
