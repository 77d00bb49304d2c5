package pglog_test

import (
	"context"
	"strings"
	"testing"

	"dbcloud/pglog"
)

// TestReader_Redact: messages come back with host paths rewritten, most
// specific name first; a search sees the rewritten message only, so a
// search for a host path finds nothing (no oracle for the tenant), and a
// term found only inside a name still finds its line (the raw byte search
// is not trusted for it).
func TestReader_Redact(t *testing.T) {
	dir := t.TempDir()
	const svc = "/srv/rt/services/abc"
	appendLines(t, dir, fileName(t0),
		rec{ts: at(1), sev: "LOG", msg: `listening on Unix socket "` + svc + `/0/run/.s.PGSQL.5432"`},
		rec{ts: at(2), sev: "ERROR", msg: `could not open extension control file "/usr/share/postgresql/15/extension/x.control": No such file or directory`},
		rec{ts: at(3), sev: "LOG", msg: `archive directory "/srv/rt/pool/p1/archive" is gone`},
		rec{ts: at(4), sev: "LOG", msg: `checkpoint starting: time`})
	r := &pglog.Reader{Key: testKey, Redact: pglog.NewRedactor([]pglog.PathName{
		{Path: "/srv/rt/", Name: "<runtime>"},
		{Path: svc, Name: "<service>"},
		{Path: "/usr/share/postgresql/15", Name: "<postgresql-share>"},
	})}
	read := func(search ...string) []string {
		t.Helper()
		p, err := r.Read(context.Background(), []pglog.Source{{Dir: dir}}, pglog.Query{Search: search})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range p.Entries {
			out = append(out, e.Message)
		}
		return out
	}
	got := strings.Join(read(), "\n")
	want := strings.Join([]string{
		`checkpoint starting: time`,
		`archive directory "<runtime>/pool/p1/archive" is gone`,
		`could not open extension control file "<postgresql-share>/extension/x.control": No such file or directory`,
		`listening on Unix socket "<service>/0/run/.s.PGSQL.5432"`,
	}, "\n")
	if got != want {
		t.Errorf("messages:\n%s\nwant:\n%s", got, want)
	}
	for _, term := range []string{"/srv/rt", "srv/rt/services", "/usr/share/postgresql", "share/postgresql/15/ext"} {
		if got := read(term); len(got) != 0 {
			t.Errorf("search %q found %q; want nothing: the page shows no host path", term, got)
		}
	}
	for term, n := range map[string]int{"<service>/0/run": 1, "SERVICE": 1, "runtime": 1, "postgresql-share": 1, "x.control": 1} {
		if got := read(term); len(got) != n {
			t.Errorf("search %q found %q; want %d lines", term, got, n)
		}
	}
}
