package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

// Logs: a service's PostgreSQL log with search, severities and a time
// range (UTC, as the page says), a live tail that rereads the newest lines
// when the project's event stream says the log has a newer one (live.go),
// and the same selection as a text file.

type logsData struct {
	V            *cloud.ServiceView
	Page         *dbcloud.LogPage
	Search       string
	Severities   []string
	Chosen       map[string]bool
	Since, Until string
	Tail         bool
	Next         string
	Download     string
}

var severities = []string{"DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "LOG", "FATAL", "PANIC"}

// logsPerPage is a page's lines; logsDownloadMax bounds a download.
const (
	logsPerPage     = 100
	logsDownloadMax = 20 * dbcloud.MaxLogEntries
)

// logQuery reads the selection a logs page's query names: what the API
// takes, and the query to repeat it with (for the next page and the
// download), without the cursor.
func logQuery(q url.Values) (dbcloud.LogQuery, url.Values, error) {
	lq := dbcloud.LogQuery{Cursor: q.Get("cursor"), Severities: q["severity"], Limit: logsPerPage}
	keep := url.Values{}
	if s := strings.TrimSpace(q.Get("search")); s != "" {
		lq.Search = []string{s}
		keep.Set("search", s)
	}
	if len(q["severity"]) > 0 {
		keep["severity"] = q["severity"]
	}
	for _, b := range []struct {
		name string
		into **time.Time
	}{{"since", &lq.Since}, {"until", &lq.Until}} {
		v := q.Get(b.name)
		if v == "" {
			continue
		}
		t, err := parseLocalUTC(v)
		if err != nil {
			return lq, keep, dbcloud.Errorf(dbcloud.KindInvalid, "%q is not a date and time (the %s field).", v, b.name)
		}
		*b.into = &t
		keep.Set(b.name, v)
	}
	return lq, keep, nil
}

// parseLocalUTC reads a datetime-local field's value, which has no zone:
// the console's times are UTC, as its pages say.
func parseLocalUTC(v string) (time.Time, error) {
	t, err := time.Parse("2006-01-02T15:04:05", v)
	if err != nil {
		t, err = time.Parse("2006-01-02T15:04", v)
	}
	return t, err
}

func (h *Handler) logsGet(w http.ResponseWriter, r *http.Request, s *session) {
	pid, sid := r.PathValue("pid"), r.PathValue("sid")
	q := r.URL.Query()
	h.show(w, r, s, "logs", "Logs", h.fromQuery(r, s), func() (any, error) {
		v, err := h.cloud.GetService(r.Context(), pid, sid)
		if err != nil {
			return nil, err
		}
		lq, keep, err := logQuery(q)
		if err != nil {
			return nil, err
		}
		p, err := h.cloud.Logs(r.Context(), pid, sid, lq)
		if err != nil {
			return nil, err
		}
		base := "/p/" + pid + "/services/" + sid + "/logs"
		d := logsData{V: v, Page: p, Search: q.Get("search"), Severities: severities, Chosen: map[string]bool{},
			Since: q.Get("since"), Until: q.Get("until"), Tail: q.Get("tail") == "1" && lq.Cursor == "", Download: base + ".txt?" + keep.Encode()}
		for _, sv := range q["severity"] {
			d.Chosen[sv] = true
		}
		if p.Cursor != "" {
			next := url.Values{"cursor": {p.Cursor}}
			for k, vs := range keep {
				next[k] = vs
			}
			d.Next = base + "?" + next.Encode()
		}
		return d, nil
	})
}

// logsDownload answers the selection as a text file, newest line first
// as on the page, up to logsDownloadMax lines.
func (h *Handler) logsDownload(w http.ResponseWriter, r *http.Request, s *session) {
	pid, sid := r.PathValue("pid"), r.PathValue("sid")
	lq, _, err := logQuery(r.URL.Query())
	if err != nil {
		h.render(w, r, http.StatusBadRequest, "error", page{User: s.principal.User, CSRF: s.principal.Token.CSRF, Error: h.errorMessage(r, err)})
		return
	}
	lq.Cursor, lq.Limit = "", dbcloud.MaxLogEntries
	var b strings.Builder
	for n := 0; n < logsDownloadMax; {
		p, err := h.cloud.Logs(r.Context(), pid, sid, lq)
		if err != nil {
			h.render(w, r, h.failed(r, err).status, "error", page{User: s.principal.User, CSRF: s.principal.Token.CSRF, Error: h.errorMessage(r, err)})
			return
		}
		for _, e := range p.Entries {
			fmt.Fprintf(&b, "%s [%s] %s\n", e.Timestamp.UTC().Format(time.RFC3339Nano), e.Severity, e.Message)
		}
		n += len(p.Entries)
		if p.Cursor == "" || len(p.Entries) == 0 {
			break
		}
		lq.Cursor = p.Cursor
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="`+sid+`-postgresql.log"`)
	w.Write([]byte(b.String()))
}
