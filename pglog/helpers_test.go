package pglog_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rec is one log line to write.
type rec struct {
	ts        time.Time
	sev       string
	msg       string
	statement string
}

// pgEscape quotes s as PostgreSQL's escape_json does: only '"', '\\' and
// control characters are escaped; everything else, UTF-8 included, is
// written as it is.
func pgEscape(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		default:
			if c < ' ' {
				fmt.Fprintf(&b, `\u%04x`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// pgTime formats a time as jsonlog does with log_timezone = UTC.
func pgTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") + " UTC" }

// jsonLine renders r as PostgreSQL 15's jsonlog writes a client backend's
// line (fields from runtime-notes.md section 5, in jsonlog.c's order).
func jsonLine(r rec) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"timestamp":"%s","user":"tsdbadmin","dbname":"tsdb","pid":%d,"remote_host":"127.0.0.1","remote_port":%d,`,
		pgTime(r.ts), 20000+r.ts.Nanosecond()%9000, 40000+r.ts.Nanosecond()%20000)
	fmt.Fprintf(&b, `"session_id":"6b023b2a.6c30","line_num":%d,"ps":"SELECT","session_start":"%s","vxid":"3/2","txid":0,`,
		r.ts.Nanosecond()%1000, r.ts.UTC().Format("2006-01-02 15:04:05")+" UTC")
	fmt.Fprintf(&b, `"error_severity":%s,`, pgEscape(r.sev))
	if r.sev == "ERROR" {
		b.WriteString(`"state_code":"42P01",`)
	} else {
		b.WriteString(`"state_code":"00000",`)
	}
	fmt.Fprintf(&b, `"message":%s,`, pgEscape(r.msg))
	if r.statement != "" {
		fmt.Fprintf(&b, `"statement":%s,"cursor_position":15,`, pgEscape(r.statement))
	}
	b.WriteString(`"application_name":"psql","backend_type":"client backend","query_id":0}`)
	b.WriteByte('\n')
	return b.String()
}

// fileName is the name the collector gives a file opened at t.
func fileName(t time.Time) string {
	return "postgresql-" + t.UTC().Format("2006-01-02_150405") + ".json"
}

// appendLines appends the records' lines to dir/name, creating it.
func appendLines(tb testing.TB, dir, name string, recs ...rec) {
	tb.Helper()
	appendRaw(tb, dir, name, linesOf(recs...))
}

func linesOf(recs ...rec) string {
	var b strings.Builder
	for _, r := range recs {
		b.WriteString(jsonLine(r))
	}
	return b.String()
}

func appendRaw(tb testing.TB, dir, name, data string) {
	tb.Helper()
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := f.WriteString(data); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
}

var t0 = time.Date(2026, 11, 21, 23, 19, 17, 0, time.UTC)

// at is t0 plus i milliseconds: the log's precision.
func at(i int) time.Time { return t0.Add(time.Duration(i) * time.Millisecond) }

func timePtr(t time.Time) *time.Time { return &t }
