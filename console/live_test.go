package console_test

import (
	"bufio"
	stdhttp "net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"dbcloud"
)

// stream is an open console event stream, read line by line.
type stream struct {
	t     *testing.T
	lines chan string
	close func()
}

func (b *browser) events(pid, lastID string) *stream {
	b.t.Helper()
	return b.eventsAt("/p/"+pid+"/events", lastID)
}

func (b *browser) eventsAt(path, lastID string) *stream {
	b.t.Helper()
	req, _ := stdhttp.NewRequest("GET", b.s.srv.URL+path, nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	res, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		res.Body.Close()
		b.t.Fatalf("GET events: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	st := &stream{t: b.t, lines: make(chan string, 100), close: func() { res.Body.Close() }}
	b.t.Cleanup(st.close)
	go func() {
		defer close(st.lines)
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			st.lines <- sc.Text()
		}
	}()
	return st
}

// next reads the stream's next message of the given event type and
// returns its id and data.
func (st *stream) next(event string) (id int64, data string) {
	st.t.Helper()
	deadline := time.After(20 * time.Second)
	var typ string
	for {
		select {
		case l, ok := <-st.lines:
			if !ok {
				st.t.Fatalf("the stream ended before a %q event", event)
			}
			switch {
			case strings.HasPrefix(l, "id: "):
				id, _ = strconv.ParseInt(strings.TrimPrefix(l, "id: "), 10, 64)
			case strings.HasPrefix(l, "event: "):
				typ = strings.TrimPrefix(l, "event: ")
			case strings.HasPrefix(l, "data: "):
				data = strings.TrimPrefix(l, "data: ")
			case l == "" && typ != "":
				if typ == event {
					return id, data
				}
				typ = ""
			}
		case <-deadline:
			st.t.Fatalf("no %q event within 20s", event)
		}
	}
}

// TestConsoleLiveEvents: a console page's event stream, with the
// session's cookie, starts at the newest event (a "ready" message naming
// it), reports a service's change as it commits, and after a reconnect
// with Last-Event-ID resumes where it was. A live page's read of itself
// takes no form's answer, so a secret waits for the page it belongs to.
func TestConsoleLiveEvents(t *testing.T) {
	s, b, page := signedIn(t)
	pid := s.boot.Project.ID
	csrf := csrfOf(t, page)
	b.post(s.srv.URL+"/p/"+pid+"/services", url.Values{"csrf": {csrf}, "name": {"live"}, "size": {"500/2"}})
	sid := listServices(t, s)[0].Service.ID

	st := b.events(pid, "")
	ready, _ := st.next("ready")
	if ready == 0 {
		t.Fatal("the stream's ready message names no event, after the create recorded one")
	}
	settle(t, s, sid, dbcloud.StatusReady)
	first, _ := st.next("change") // the create operation's end
	id, data := st.next("change")
	if first <= ready || !strings.Contains(data, `"resource_id":"`+sid+`"`) || !strings.Contains(data, `"status":"READY"`) {
		t.Fatalf("change %d %s, want the service's READY after event %d", id, data, ready)
	}
	st.close()

	again := b.events(pid, strconv.FormatInt(ready, 10))
	if resumed, _ := again.next("ready"); resumed != ready {
		t.Errorf("a resumed stream says ready at %d, want %d", resumed, ready)
	}
	again.next("change")
	if id2, data2 := again.next("change"); id2 != id || data2 != data {
		t.Errorf("resumed after %d: %d %s, want %d %s", ready, id2, data2, id, data)
	}
	again.close()

	// The create's answer (its password) waits through a live read.
	b.c.CheckRedirect = func(*stdhttp.Request, []*stdhttp.Request) error { return stdhttp.ErrUseLastResponse }
	res, _ := b.post(s.srv.URL+"/p/"+pid+"/services", url.Values{"csrf": {csrf}, "name": {"live-two"}, "size": {"500/2"}})
	b.c.CheckRedirect = nil
	to := res.Header.Get("Location")
	req, _ := stdhttp.NewRequest("GET", s.srv.URL+to, nil)
	req.Header.Set("X-Console-Live", "1")
	lres, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	lres.Body.Close()
	if _, page = b.get(s.srv.URL + to); !strings.Contains(page, `id="secret-password"`) {
		t.Errorf("after a live read the created service's page shows no password:\n%s", page)
	}
}

// TestConsoleLiveLogTail: a logs page's stream (tail=the service) says
// "logs" when the service's log has a newer line, so the page's live tail
// needs no timer. (This runtime's newest line is new at every read.)
func TestConsoleLiveLogTail(t *testing.T) {
	s, b, page := signedIn(t)
	pid := s.boot.Project.ID
	b.post(s.srv.URL+"/p/"+pid+"/services", url.Values{"csrf": {csrfOf(t, page)}, "name": {"tailed"}, "size": {"500/2"}})
	sid := listServices(t, s)[0].Service.ID
	st := b.eventsAt("/p/"+pid+"/events?tail="+sid, "")
	st.next("ready")
	st.next("logs")
}
