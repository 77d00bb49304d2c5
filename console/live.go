package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

// Live pages: each open console tab follows its project's event stream
// (one stream per tab, from this origin, with the session's cookie), and
// on an event that concerns what it shows it reads itself again and swaps
// the parts marked data-live (console.js). The server renders every part,
// so a live page and a reloaded one cannot differ, and nothing is polled
// per row.

// Stream timing: how often a stream reads the store for events of other
// control planes sharing it, how often an idle stream says it is alive,
// and how often it checks that its session still holds.
const (
	livePoll      = time.Second
	liveHeartbeat = 15 * time.Second
)

// maxLiveStreams caps the streams one session holds, a tab each: enough
// for a person, not a way to pin the server's connections.
const maxLiveStreams = 16

// liveHeader marks a live page's read of itself: it shows no form's
// answer (that is for the page the form redirected to, in whichever tab
// that is).
const liveHeader = "X-Console-Live"

// liveStreams counts the open streams per session and ends them all when
// the server shuts down (a stream never ends by itself, so it would hold
// the shutdown until its deadline).
type liveStreams struct {
	mu       sync.Mutex
	open     map[string]int
	stop     chan struct{}
	stopOnce sync.Once
}

func newLiveStreams() *liveStreams {
	return &liveStreams{open: map[string]int{}, stop: make(chan struct{})}
}

func (l *liveStreams) take(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] >= maxLiveStreams {
		return false
	}
	l.open[key]++
	return true
}

func (l *liveStreams) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// StopStreams ends the console's live streams; the server calls it at
// shutdown.
func (h *Handler) StopStreams() { h.live.stopOnce.Do(func() { close(h.live.stop) }) }

// liveEvent is what a page needs of an event to decide whether to read
// itself again; the page then shows what the domain says, not the event.
type liveEvent struct {
	Type         dbcloud.EventType `json:"type"`
	ResourceKind string            `json:"resource_kind"`
	ResourceID   string            `json:"resource_id"`
	Status       string            `json:"status,omitempty"`
}

// events streams the project's events to a console page as Server-Sent
// Events. A new stream starts at the newest event (the page was just
// rendered; the "ready" message tells it to read itself once, which
// covers anything between its render and now); a reconnecting one
// resumes after its Last-Event-ID and misses nothing.
func (h *Handler) events(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, pid := r.Context(), r.PathValue("pid")
	key := onceKey(s)
	if !h.live.take(key) {
		w.Header().Set("Retry-After", "15")
		http.Error(w, fmt.Sprintf("Too many live pages open (at most %d); close a tab.", maxLiveStreams), http.StatusTooManyRequests)
		return
	}
	defer h.live.release(key)
	after, resumed := int64(0), false
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		after, resumed = n, err == nil && n >= 0
	}
	// The first read happens before the headers, so a refusal (not a
	// member of the project) is an ordinary error answer.
	evs, err := h.cloud.ListEvents(ctx, pid, after, cloud.MaxEventPage)
	if err != nil {
		h.render(w, r, h.failed(r, err).status, "error", page{Error: h.errorMessage(r, err)})
		return
	}
	if !resumed {
		if after, err = h.newestEvent(r, pid, evs); err != nil {
			h.render(w, r, h.failed(r, err).status, "error", page{Error: h.errorMessage(r, err)})
			return
		}
		evs = nil
	}
	// A logs page with its live tail on names its service: the stream
	// then also says when the service's log has a newer line.
	tail := h.newLogTail(r, pid, r.URL.Query().Get("tail"))
	rc := http.NewResponseController(w)
	// A stream outlives the server's write timeout, which is for pages.
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "retry: %d\n\nid: %d\nevent: ready\ndata: {}\n\n", livePoll.Milliseconds(), after)
	poll, beat := time.NewTicker(livePoll), time.NewTicker(liveHeartbeat)
	defer poll.Stop()
	defer beat.Stop()
	for {
		for _, e := range evs {
			b, _ := json.Marshal(liveEvent{Type: e.Type, ResourceKind: e.ResourceKind, ResourceID: e.ResourceID, Status: e.Status})
			if _, err := fmt.Fprintf(w, "id: %d\nevent: change\ndata: %s\n\n", e.ID, b); err != nil {
				return
			}
			after = e.ID
		}
		if rc.Flush() != nil {
			return
		}
		if len(evs) < cloud.MaxEventPage && !h.waitForEvents(r, s, w, rc, poll, beat) {
			return
		}
		if tail.moved(r) {
			if _, err := fmt.Fprint(w, "event: logs\ndata: {}\n\n"); err != nil {
				return
			}
		}
		if evs, err = h.cloud.ListEvents(ctx, pid, after, cloud.MaxEventPage); err != nil {
			if ctx.Err() == nil {
				h.logger.Warn("console events", "project", pid, "err", err)
			}
			return
		}
	}
}

// waitForEvents waits until this process records an event or the poll
// ticks, sending a comment at each heartbeat; false when the stream must
// end (the tab left, the server stops, the session ended).
func (h *Handler) waitForEvents(r *http.Request, s *session, w http.ResponseWriter, rc *http.ResponseController, poll, beat *time.Ticker) bool {
	changed := h.cloud.EventsChanged()
	for {
		select {
		case <-r.Context().Done():
			return false
		case <-h.live.stop:
			return false
		case <-changed:
			return true
		case <-poll.C:
			return true
		case <-beat.C:
			// A signed-out or expired session stops seeing events.
			if now, err := h.readSession(r); err != nil || now.secret != s.secret {
				return false
			}
			if _, err := fmt.Fprint(w, ": alive\n\n"); err != nil || rc.Flush() != nil {
				return false
			}
		}
	}
}

// newestEvent is the ID of the project's newest event, reading on from
// the first page the stream read.
func (h *Handler) newestEvent(r *http.Request, pid string, evs []*dbcloud.Event) (int64, error) {
	var newest int64
	for {
		if len(evs) > 0 {
			newest = evs[len(evs)-1].ID
		}
		if len(evs) < cloud.MaxEventPage {
			return newest, nil
		}
		var err error
		if evs, err = h.cloud.ListEvents(r.Context(), pid, newest, cloud.MaxEventPage); err != nil {
			return 0, err
		}
	}
}

// isLiveRead reports whether r is a live page reading itself again.
func isLiveRead(r *http.Request) bool { return r.Header.Get(liveHeader) == "1" }

// logTail follows the newest line of one service's log for a stream.
// Log lines are not events (PostgreSQL writes them, not the domain), so
// the stream looks at the newest one each time it wakes, at most once a
// livePoll, and tells the page when it changed; the page then reads its
// lines again as it does on an event, and the browser holds no timer.
type logTail struct {
	h        *Handler
	pid, sid string
	newest   dbcloud.LogEntry
	looked   time.Time
}

// newLogTail starts following sid's log, or returns nil when the stream
// follows no log (no tail asked, or the service's log cannot be read).
func (h *Handler) newLogTail(r *http.Request, pid, sid string) *logTail {
	if sid == "" {
		return nil
	}
	l := &logTail{h: h, pid: pid, sid: sid}
	newest, ok := l.read(r)
	if !ok {
		return nil
	}
	l.newest = newest
	return l
}

// read returns the service's newest log line; false when it cannot be
// read (the service was deleted, the session lost the project).
func (l *logTail) read(r *http.Request) (dbcloud.LogEntry, bool) {
	p, err := l.h.cloud.Logs(r.Context(), l.pid, l.sid, dbcloud.LogQuery{Limit: 1})
	if err != nil {
		if r.Context().Err() == nil {
			l.h.logger.Info("console log tail stops", "project", l.pid, "service", l.sid, "err", err)
		}
		return dbcloud.LogEntry{}, false
	}
	var e dbcloud.LogEntry
	if len(p.Entries) > 0 {
		e = p.Entries[0]
	}
	return e, true
}

// moved reports whether the log has a newer line than the last look.
func (l *logTail) moved(r *http.Request) bool {
	// Events can wake a stream many times a second; the log is read at
	// most once a livePoll, and the poll's tick comes back for the rest.
	if l == nil || time.Since(l.looked) < livePoll {
		return false
	}
	l.looked = time.Now()
	e, ok := l.read(r)
	if !ok || e == l.newest {
		return false
	}
	l.newest = e
	return true
}
