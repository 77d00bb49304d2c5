package http_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	stdhttp "net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/http"
	"dbcloud/internal/sse"
)

type operation struct {
	ID           string `json:"id"`
	Type         string `json:"type"`
	ResourceID   string `json:"resource_id"`
	ResourceType string `json:"resource_type"`
	RequestedBy  struct {
		AccessKey string `json:"access_key"`
		UserEmail string `json:"user_email"`
	} `json:"requested_by"`
	Accepted time.Time  `json:"accepted"`
	Finished *time.Time `json:"finished"`
	State    string     `json:"state"`
	Reason   string     `json:"reason"`
}

type operationList struct {
	Operations []operation `json:"operations"`
	NextCursor string      `json:"next_cursor"`
}

// TestOperations_List checks that each accepted request names its
// operation in its response and that a service's operations are listed
// newest first, paged, with who asked and the outcome; refused requests
// record none.
func TestOperations_List(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind, noLimits)
			res := e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "ops"}})
			var s service
			res.decode(t, &s)
			createOp := res.Header.Get("Operation-Id")
			loc := res.Header.Get("Operation-Location")
			if createOp == "" || loc != http.BasePath+e.pa()+"/operations/"+createOp {
				t.Fatalf("create: Operation-Id %q, Operation-Location %q", createOp, loc)
			}
			var op operation
			e.want(200, "", req{Method: "GET", Path: strings.TrimPrefix(loc, http.BasePath)}).decode(t, &op)
			if op.ID != createOp || op.Type != "create_service" || op.State != "pending" || op.ResourceID != s.ServiceID {
				t.Fatalf("operation %+v", op)
			}
			e.settle(s.ServiceID, dbcloud.StatusReady)

			svc := e.pa() + "/services/" + s.ServiceID
			resize := e.want(202, "", req{Method: "POST", Path: svc + "/resize", Body: map[string]any{"cpu_millis": "1000", "memory_gbs": "4"}})
			resizeOp := resize.Header.Get("Operation-Id")
			// A second resize while the first is in flight is refused and
			// records nothing; so is a size that does not exist.
			e.want(409, "OPERATION_IN_PROGRESS", req{Method: "POST", Path: svc + "/resize", Body: map[string]any{"cpu_millis": "2000", "memory_gbs": "8"}})
			e.settle(s.ServiceID, dbcloud.StatusReady)
			if r := e.want(400, "", req{Method: "POST", Path: svc + "/resize", Body: map[string]any{"cpu_millis": "3", "memory_gbs": "4"}}); r.Header.Get("Operation-Id") != "" {
				t.Errorf("a refused resize names operation %s", r.Header.Get("Operation-Id"))
			}
			stop := e.want(202, "", req{Method: "POST", Path: svc + "/stop"})
			stopOp := stop.Header.Get("Operation-Id")
			// Delete supersedes the stop in flight.
			del := e.want(202, "", req{Method: "DELETE", Path: svc})
			delOp := del.Header.Get("Operation-Id")

			var l operationList
			e.want(200, "", req{Method: "GET", Path: svc + "/operations"}).decode(t, &l)
			var got []string
			for _, o := range l.Operations {
				got = append(got, o.Type+":"+o.State)
				if o.RequestedBy.AccessKey != e.a.AccessKey || o.RequestedBy.UserEmail != "admin@example.com" {
					t.Errorf("operation %s requested by %+v", o.ID, o.RequestedBy)
				}
			}
			want := []string{"delete_service:pending", "stop_service:superseded", "resize_service:succeeded", "create_service:succeeded"}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("operations %v, want %v", got, want)
			}
			if ids := []string{l.Operations[0].ID, l.Operations[1].ID, l.Operations[2].ID, l.Operations[3].ID}; ids[0] != delOp || ids[1] != stopOp || ids[2] != resizeOp || ids[3] != createOp {
				t.Errorf("operation IDs %v, want %s %s %s %s", ids, delOp, stopOp, resizeOp, createOp)
			}
			if l.Operations[1].Reason == "" || l.Operations[1].Finished == nil {
				t.Errorf("superseded operation %+v has no reason or end", l.Operations[1])
			}

			// Paged, newest first.
			var pages []string
			cursor := ""
			for range 5 {
				path := svc + "/operations?limit=1"
				if cursor != "" {
					path += "&cursor=" + cursor
				}
				var p operationList
				e.want(200, "", req{Method: "GET", Path: path}).decode(t, &p)
				if len(p.Operations) != 1 {
					t.Fatalf("page of %d operations", len(p.Operations))
				}
				pages = append(pages, p.Operations[0].ID)
				if cursor = p.NextCursor; cursor == "" {
					break
				}
			}
			if len(pages) != 4 || pages[0] != delOp || pages[3] != createOp {
				t.Errorf("pages %v", pages)
			}

			e.want(400, "INVALID_REQUEST", req{Method: "GET", Path: svc + "/operations?limit=0"})
			e.want(400, "INVALID_REQUEST", req{Method: "GET", Path: svc + "/operations?cursor=nope"})
			// Another project's key sees nothing of it.
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: svc + "/operations", Key: e.b})
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: e.pa() + "/operations/" + createOp, Key: e.b})
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: "/projects/" + e.b.ProjectID + "/operations/" + createOp, Key: e.b})
		})
	}
}

// TestOperations_VPC lists a VPC's operations: those of its peerings.
func TestOperations_VPC(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	var v struct{ ID string }
	e.want(201, "", req{Method: "POST", Path: e.pa() + "/vpcs", Body: map[string]any{"name": "v", "cidr": "10.1.0.0/16", "region_code": "local"}}).decode(t, &v)
	vpc := e.pa() + "/vpcs/" + v.ID
	var p struct{ ID string }
	res := e.want(201, "", req{Method: "POST", Path: vpc + "/peerings", Body: map[string]any{"peer_account_id": "a", "peer_region_code": "local", "peer_vpc_id": "b"}})
	res.decode(t, &p)
	if res.Header.Get("Operation-Id") == "" {
		t.Error("peering create names no operation")
	}
	for _, path := range []string{vpc + "/operations", vpc + "/peerings/" + p.ID + "/operations"} {
		var l operationList
		e.want(200, "", req{Method: "GET", Path: path}).decode(t, &l)
		if len(l.Operations) != 1 || l.Operations[0].Type != "create_peering" || l.Operations[0].ResourceType != "peering" {
			t.Errorf("%s: %+v", path, l.Operations)
		}
	}
}

// eventStream opens the project's event stream with key a.
func (e *env) eventStream(ctx context.Context, lastID string) (*sse.Reader, func()) {
	e.t.Helper()
	hr, _ := stdhttp.NewRequestWithContext(ctx, "GET", e.srv.URL+http.BasePath+e.pa()+"/events", nil)
	hr.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(e.a.AccessKey+":"+e.a.SecretKey)))
	if lastID != "" {
		hr.Header.Set("Last-Event-ID", lastID)
	}
	res, err := e.srv.Client().Do(hr)
	if err != nil {
		e.t.Fatal(err)
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		e.t.Fatalf("events: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	return sse.NewReader(res.Body), func() { res.Body.Close() }
}

type event struct {
	ID             int64  `json:"id"`
	Type           string `json:"type"`
	ResourceID     string `json:"resource_id"`
	Status         string `json:"status"`
	PreviousStatus string `json:"previous_status"`
	OperationID    string `json:"operation_id"`
	Outcome        string `json:"outcome"`
}

func nextEvent(t testing.TB, r *sse.Reader) event {
	t.Helper()
	m, err := r.Next()
	if err != nil {
		t.Fatalf("read event: %v", err)
	}
	var ev event
	if err := json.Unmarshal([]byte(m.Data), &ev); err != nil {
		t.Fatalf("event %q: %v", m.Data, err)
	}
	if m.ID != strconv.FormatInt(ev.ID, 10) || m.Event != ev.Type {
		t.Fatalf("message id %q event %q, data %s", m.ID, m.Event, m.Data)
	}
	return ev
}

// TestEvents_Stream follows a create and a delete on the event stream, in
// order, and resumes after an event with Last-Event-ID.
func TestEvents_Stream(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind, noLimits)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r, done := e.eventStream(ctx, "")
			defer done()
			res := e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "ev"}})
			var s service
			res.decode(t, &s)
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(202, "", req{Method: "DELETE", Path: e.pa() + "/services/" + s.ServiceID})

			var got []string
			var ids []int64
			for range 4 {
				ev := nextEvent(t, r)
				ids = append(ids, ev.ID)
				got = append(got, ev.Type+":"+ev.PreviousStatus+">"+ev.Status+ev.Outcome)
				if ev.ResourceID != s.ServiceID {
					t.Errorf("event %+v is not of %s", ev, s.ServiceID)
				}
			}
			// settle ends the operation before it shows the status, in one
			// transaction; the engine does the same.
			want := []string{"service.status:>QUEUED", "operation.finished:>succeeded", "service.status:QUEUED>READY", "service.status:READY>DELETING"}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("events %v, want %v", got, want)
			}
			for i, id := range ids {
				if id != int64(i+1) {
					t.Errorf("event IDs %v, want 1 to 4", ids)
					break
				}
			}
			done()

			// Resume after the second event.
			r2, done2 := e.eventStream(ctx, "2")
			defer done2()
			if ev := nextEvent(t, r2); ev.ID != 3 {
				t.Errorf("resumed at %d, want 3", ev.ID)
			}
			e.want(400, "INVALID_REQUEST", req{Method: "GET", Path: e.pa() + "/events", Header: map[string]string{"Last-Event-ID": "x"}})
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: e.pa() + "/events", Key: e.b})
		})
	}
}

// TestOperations_ReplicaSet lists a read replica set's operations under it
// and under its service.
func TestOperations_ReplicaSet(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	s := e.readyService(map[string]any{"name": "parent"})
	svc := e.pa() + "/services/" + s.ServiceID
	res := e.want(202, "", req{Method: "POST", Path: svc + "/replicaSets", Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}})
	var r struct{ ID string }
	res.decode(t, &r)
	opID := res.Header.Get("Operation-Id")
	if opID == "" {
		t.Fatal("replica set create names no operation")
	}
	var l operationList
	e.want(200, "", req{Method: "GET", Path: svc + "/replicaSets/" + r.ID + "/operations"}).decode(t, &l)
	if len(l.Operations) != 1 || l.Operations[0].ID != opID || l.Operations[0].ResourceType != "replica_set" {
		t.Errorf("replica set operations %+v", l.Operations)
	}
	e.want(200, "", req{Method: "GET", Path: svc + "/operations"}).decode(t, &l)
	if len(l.Operations) != 2 || l.Operations[0].ID != opID || l.Operations[1].Type != "create_service" {
		t.Errorf("service operations %+v", l.Operations)
	}
	e.want(404, "NOT_FOUND", req{Method: "GET", Path: svc + "/replicaSets/aaaaaaaaaa/operations"})
}

// TestOperations_IdempotentReplay: a replayed response names the operation
// of the first request, which the replay did not repeat.
func TestOperations_IdempotentReplay(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	r := req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "once"}, Header: map[string]string{"Idempotency-Key": "k1"}}
	first := e.want(202, "", r)
	again := e.want(202, "", r)
	id := first.Header.Get("Operation-Id")
	if id == "" || again.Header.Get("Operation-Id") != id || again.Header.Get("Operation-Location") != first.Header.Get("Operation-Location") {
		t.Errorf("first names %q (%s), replay %q (%s)", id, first.Header.Get("Operation-Location"),
			again.Header.Get("Operation-Id"), again.Header.Get("Operation-Location"))
	}
}

// openEvents opens the project a's event stream with key and returns the
// response, whatever its status.
func (e *env) openEvents(ctx context.Context, key *cloud.NewAPIKey) *stdhttp.Response {
	e.t.Helper()
	hr, _ := stdhttp.NewRequestWithContext(ctx, "GET", e.srv.URL+http.BasePath+e.pa()+"/events", nil)
	hr.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(key.AccessKey+":"+key.SecretKey)))
	res, err := e.srv.Client().Do(hr)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

// TestEvents_StreamsPerCredential: one key holds at most the default cap
// of event streams at once; one more is answered 429 RATE_LIMITED with
// Retry-After, while another key of the project still gets one, and the
// first gets one again once one of its streams is closed.
func TestEvents_StreamsPerCredential(t *testing.T) {
	cfg := noLimits
	cfg.MaxStreamsPerCredential = http.DefaultConfig().MaxStreamsPerCredential
	n := cfg.MaxStreamsPerCredential
	if n <= 0 {
		t.Fatalf("no default cap of event streams per credential (%d)", n)
	}
	e := newEnv(t, "sqlite", cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var open []*stdhttp.Response
	defer func() {
		for _, res := range open {
			res.Body.Close()
		}
	}()
	for i := 0; i < n; i++ {
		res := e.openEvents(ctx, e.a)
		open = append(open, res)
		if res.StatusCode != 200 {
			t.Fatalf("stream %d of %d: status %d, want 200", i+1, n, res.StatusCode)
		}
	}
	over := e.openEvents(ctx, e.a)
	var body []byte
	if over.StatusCode != 200 { // a stream's body never ends
		body, _ = io.ReadAll(over.Body)
	}
	over.Body.Close()
	var eb struct{ Code, Message string }
	json.Unmarshal(body, &eb)
	if over.StatusCode != 429 || eb.Code != "RATE_LIMITED" || eb.Message == "" || over.Header.Get("Retry-After") == "" {
		t.Fatalf("stream %d of one key: status %d, Retry-After %q, body %s; want 429 RATE_LIMITED with Retry-After",
			n+1, over.StatusCode, over.Header.Get("Retry-After"), body)
	}
	other, err := e.cloud.CreateAPIKey(context.Background(), e.a.ProjectID, "second", "admin", "admin@example.com")
	if err != nil {
		t.Fatal(err)
	}
	res := e.openEvents(ctx, other)
	open = append(open, res)
	if res.StatusCode != 200 {
		t.Fatalf("a second key's stream: status %d, want 200", res.StatusCode)
	}
	// Closing a stream gives its place back, once the server has seen
	// the client leave.
	open[0].Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := e.openEvents(ctx, e.a)
		if res.StatusCode == 200 {
			open = append(open, res)
			break
		}
		res.Body.Close()
		if time.Now().After(deadline) {
			t.Fatalf("after closing a stream: status %d for 10 s, want 200", res.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
