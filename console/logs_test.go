package console_test

import (
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"dbcloud"
)

// TestConsoleLogsRangeTailDownload: the logs page passes its time range
// (UTC) and search to the log reader, keeps them in the form, marks the
// log lines for a live tail when asked, and offers the same selection as
// a text file to download.
func TestConsoleLogsRangeTailDownload(t *testing.T) {
	rt := &fakeRuntime{passwords: map[string]string{}}
	s := newSite(t, rt)
	b := s.browser()
	_, page := b.get(s.srv.URL + "/signin")
	_, page = b.signIn(page, s.boot.User.Email, s.boot.Password)
	base := s.srv.URL + "/p/" + s.boot.Project.ID
	b.post(base+"/services", url.Values{"csrf": {csrfOf(t, page)}, "name": {"logged"}, "size": {"500/2"}})
	sid := listServices(t, s)[0].Service.ID
	settle(t, s, sid, dbcloud.StatusReady)

	q := url.Values{"search": {"ready"}, "since": {"2026-01-02T03:04:05"}, "until": {"2026-01-02T04:00"}, "severity": {"LOG"}, "tail": {"1"}}
	_, page = b.get(base + "/services/" + sid + "/logs?" + q.Encode())
	last := rt.lastLogQuery()
	since, until := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC)
	if last.Since == nil || !last.Since.Equal(since) || last.Until == nil || !last.Until.Equal(until) || len(last.Search) != 1 || last.Search[0] != "ready" {
		t.Errorf("the log reader was asked %+v, want since %v until %v search ready", last, since, until)
	}
	for _, want := range []string{`value="2026-01-02T03:04:05"`, `value="2026-01-02T04:00"`, `data-tail`, `id="log-tail" type="checkbox" name="tail" value="1" checked`, "ready to accept connections"} {
		if !strings.Contains(page, want) {
			t.Errorf("the logs page lacks %s", want)
		}
	}
	dl := regexpFind(t, page, `href="(/p/[^"]+/logs\.txt\?[^"]+)" download`)
	res, text := b.get(s.srv.URL + htmlUnescape(dl))
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") ||
		!strings.Contains(res.Header.Get("Content-Disposition"), "attachment") || !strings.Contains(text, "[LOG] database system is ready to accept connections") {
		t.Errorf("download: %d %s %q\n%s", res.StatusCode, res.Header.Get("Content-Type"), res.Header.Get("Content-Disposition"), text)
	}
	last = rt.lastLogQuery()
	if last.Since == nil || !last.Since.Equal(since) || last.Limit != dbcloud.MaxLogEntries {
		t.Errorf("the download asked %+v, want the page's range in pages of %d", last, dbcloud.MaxLogEntries)
	}

	_, page = b.get(base + "/services/" + sid + "/logs?since=yesterday")
	if !strings.Contains(page, `&#34;yesterday&#34; is not a date and time`) {
		t.Errorf("a bad time: no error\n%s", page)
	}
}

// regexpFind returns the first group of re in page.
func regexpFind(t *testing.T, page, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no %s in the page:\n%s", re, page)
	}
	return m[1]
}

func (r *fakeRuntime) lastLogQuery() dbcloud.LogQuery {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.logQueries) == 0 {
		return dbcloud.LogQuery{}
	}
	return r.logQueries[len(r.logQueries)-1]
}
