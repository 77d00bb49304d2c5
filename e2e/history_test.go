package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"dbcloud/internal/sse"
)

// send makes a request and returns the response's status, headers and body.
func (s *server) send(method, path string, body any) (int, http.Header, []byte) {
	s.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.baseURL+path, r)
	req.SetBasicAuth(s.boot.AccessKey, s.boot.SecretKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := s.client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, raw
}

// events opens the project's event stream, resuming after lastID if set.
func (s *server) events(ctx context.Context, lastID string) (*sse.Reader, func()) {
	s.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.baseURL+"/projects/"+s.boot.ProjectID+"/events", nil)
	req.SetBasicAuth(s.boot.AccessKey, s.boot.SecretKey)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	// Not s.client: its timeout would end the stream.
	res, err := (&http.Client{Transport: s.client.Transport}).Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		s.t.Fatalf("events: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	return sse.NewReader(res.Body), func() { res.Body.Close() }
}

type streamEvent struct {
	ID             int64     `json:"id"`
	Type           string    `json:"type"`
	Time           time.Time `json:"time"`
	ResourceID     string    `json:"resource_id"`
	Status         string    `json:"status"`
	PreviousStatus string    `json:"previous_status"`
	OperationID    string    `json:"operation_id"`
	OperationType  string    `json:"operation_type"`
	Outcome        string    `json:"outcome"`
	Primary        string    `json:"primary"`
	Reason         string    `json:"reason"`
	Snapshot       *struct {
		StopLSN   string `json:"stop_lsn"`
		SizeBytes int64  `json:"size_bytes"`
	} `json:"snapshot"`
}

// readUntil reads events until one satisfies stop, checking that IDs
// follow each other from after+1, and returns them.
func readUntil(t testing.TB, r *sse.Reader, after int64, stop func(streamEvent) bool) []streamEvent {
	t.Helper()
	var out []streamEvent
	for {
		m, err := r.Next()
		if err != nil {
			t.Fatalf("event stream ended after %+v: %v", out, err)
		}
		var ev streamEvent
		if err := json.Unmarshal([]byte(m.Data), &ev); err != nil {
			t.Fatalf("event %q: %v", m.Data, err)
		}
		if m.ID != strconv.FormatInt(ev.ID, 10) || m.Event != ev.Type {
			t.Fatalf("message id %q event %q with data %s", m.ID, m.Event, m.Data)
		}
		if ev.ID != after+1 {
			t.Fatalf("event %d after event %d: lost or duplicated events (%s)", ev.ID, after, m.Data)
		}
		after = ev.ID
		out = append(out, ev)
		if stop(ev) {
			return out
		}
	}
}

// statuses lists the status changes of id among evs, in order.
func statuses(evs []streamEvent, id string) []string {
	var out []string
	for _, e := range evs {
		if e.Type == "service.status" && e.ResourceID == id {
			out = append(out, e.Status)
		}
	}
	return out
}

type opJSON struct {
	ID          string `json:"id"`
	Type        string `json:"type"`
	State       string `json:"state"`
	Reason      string `json:"reason"`
	RequestedBy struct {
		AccessKey string `json:"access_key"`
		System    string `json:"system"`
	} `json:"requested_by"`
	Accepted time.Time  `json:"accepted"`
	Started  *time.Time `json:"started"`
	Finished *time.Time `json:"finished"`
}

// accepted sends a change that must be accepted and returns its
// operation's ID after checking that Operation-Location names it.
func (s *server) accepted(method, path string, body any) string {
	s.t.Helper()
	code, h, raw := s.send(method, path, body)
	if code != 202 {
		s.t.Fatalf("%s %s: %d %s", method, path, code, raw)
	}
	id := h.Get("Operation-Id")
	if id == "" || h.Get("Operation-Location") != "/public/api/v1/projects/"+s.boot.ProjectID+"/operations/"+id {
		s.t.Fatalf("%s %s: Operation-Id %q, Operation-Location %q", method, path, id, h.Get("Operation-Location"))
	}
	return id
}

// waitOperation polls an operation until it is no longer pending.
func (s *server) waitOperation(id string, within time.Duration) opJSON {
	s.t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		var op opJSON
		if code := s.call("GET", "/projects/"+s.boot.ProjectID+"/operations/"+id, nil, &op); code != 200 {
			s.t.Fatalf("operation %s: %d", id, code)
		}
		if op.State != "pending" {
			return op
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("operation %s still pending after %v: %+v", id, within, op)
		}
	}
}

func (s *server) operations(id string) []opJSON {
	s.t.Helper()
	var l struct {
		Operations []opJSON `json:"operations"`
	}
	if code := s.call("GET", s.services()+"/"+id+"/operations", nil, &l); code != 200 {
		s.t.Fatalf("operations of %s: %d", id, code)
	}
	return l.Operations
}

// TestHistory follows a service through its life on the event stream and
// in its operation list: a create seen as it happens; a restart of dbcloud
// after which the stream resumes with Last-Event-ID without losing or
// repeating an event; a resize; a resize that fails (its instance's
// configuration broken under it); a failover. Then the operation list
// shows them all, newest first, with their outcomes and who asked.
func TestHistory(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	stream, closeStream := s.events(ctx, "")
	createOp := s.accepted("POST", s.services(), map[string]any{"name": "history"})
	var list []service
	s.call("GET", s.services(), nil, &list)
	id := list[0].ServiceID
	evs := readUntil(t, stream, 0, func(e streamEvent) bool { return e.ResourceID == id && e.Status == "READY" })
	if got := strings.Join(statuses(evs, id), " "); got != "QUEUED CONFIGURING READY" {
		t.Errorf("statuses of the create: %s", got)
	}
	var finished bool
	for _, e := range evs {
		finished = finished || (e.Type == "operation.finished" && e.OperationID == createOp && e.Outcome == "succeeded")
	}
	if !finished {
		t.Errorf("no end of the create operation among %+v", evs)
	}
	last := evs[len(evs)-1].ID
	closeStream()

	// Changes while nobody listens, across a restart, are all there.
	s.restart()
	resizeOp := s.accepted("POST", s.services()+"/"+id+"/resize", map[string]string{"cpu_millis": "1000", "memory_gbs": "4"})
	s.waitStatus(id, "READY", 2*time.Minute)
	stream, closeStream = s.events(ctx, strconv.FormatInt(last, 10))
	defer closeStream()
	evs = readUntil(t, stream, last, func(e streamEvent) bool {
		return e.Type == "operation.finished" && e.OperationID == resizeOp
	})
	evs = append(evs, readUntil(t, stream, evs[len(evs)-1].ID, func(e streamEvent) bool { return e.ResourceID == id && e.Status == "READY" })...)
	if got := strings.Join(statuses(evs, id), " "); got != "CONFIGURING READY" {
		t.Errorf("statuses of the resize after the restart: %s", got)
	}
	last = evs[len(evs)-1].ID

	// A resize whose restart cannot succeed: the instance's configuration
	// has a syntax error. The operation fails with a reason.
	auto := filepath.Join(s.dir, "runtime", "services", id, "0", "pgdata", "postgresql.auto.conf")
	orig, err := os.ReadFile(auto)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(auto, append(append([]byte{}, orig...), []byte("this is = not = a setting\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	failedOp := s.accepted("POST", s.services()+"/"+id+"/resize", map[string]string{"cpu_millis": "500", "memory_gbs": "2"})
	if op := s.waitOperation(failedOp, 4*time.Minute); op.State != "failed" || op.Reason == "" || op.Finished == nil {
		t.Fatalf("broken resize: %+v", op)
	}
	if err := os.WriteFile(auto, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	// The next resize repairs it.
	repairOp := s.accepted("POST", s.services()+"/"+id+"/resize", map[string]string{"cpu_millis": "1000", "memory_gbs": "4"})
	s.waitStatus(id, "READY", 2*time.Minute)

	// A failover: an HA standby, then the primary killed.
	haOp := s.accepted("POST", s.services()+"/"+id+"/setHA", map[string]int{"replica_count": 1})
	s.waitStatus(id, "READY", 3*time.Minute)
	primary, _ := s.haPrimary(id)
	killPrimary(t, filepath.Join(s.dir, "runtime", "services", id, strconv.Itoa(primary)))
	evs = readUntil(t, stream, last, func(e streamEvent) bool { return e.Type == "service.failover" && e.ResourceID == id })
	if e := evs[len(evs)-1]; e.Primary == "" || e.Primary == id+"-"+strconv.Itoa(primary) {
		t.Errorf("failover event %+v", e)
	}
	s.waitStatus(id, "READY", 2*time.Minute)

	ops := s.operations(id)
	var got []string
	for _, op := range ops {
		got = append(got, op.Type+":"+op.State)
	}
	want := []string{"failover:succeeded", "set_ha:succeeded", "resize_service:succeeded", "resize_service:failed",
		"resize_service:succeeded", "create_service:succeeded"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("operations newest first: %v, want %v", got, want)
	}
	for i, wantID := range []string{"", haOp, repairOp, failedOp, resizeOp, createOp} {
		op := ops[i]
		if wantID != "" && op.ID != wantID {
			t.Errorf("operation %d is %s, want %s", i, op.ID, wantID)
		}
		if op.Started == nil || op.Finished == nil || op.Finished.Before(*op.Started) || op.Started.Before(op.Accepted) {
			t.Errorf("operation %s: accepted %v, started %v, finished %v", op.ID, op.Accepted, op.Started, op.Finished)
		}
		if i == 0 {
			if op.RequestedBy.System == "" || op.RequestedBy.AccessKey != "" {
				t.Errorf("failover requested by %+v, want the system", op.RequestedBy)
			}
		} else if op.RequestedBy.AccessKey != s.boot.AccessKey {
			t.Errorf("operation %s requested by %+v, want key %s", op.ID, op.RequestedBy, s.boot.AccessKey)
		}
	}
	t.Logf("failed resize: %s", ops[3].Reason)
}
