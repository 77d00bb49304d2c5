package http

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

// What a client reads of the past and follows of the present: operations,
// the project's event stream, and a service's snapshots.

// streamed is the status a handler returns when it wrote its response
// itself (the event stream).
const streamed = -1

type requesterJSON struct {
	AccessKey string `json:"access_key,omitempty"`
	UserID    string `json:"user_id,omitempty"`
	UserEmail string `json:"user_email,omitempty"`
	System    string `json:"system,omitempty"`
}

type operationJSON struct {
	ID           string        `json:"id"`
	Type         string        `json:"type"`
	ResourceID   string        `json:"resource_id"`
	ResourceType string        `json:"resource_type"`
	RequestedBy  requesterJSON `json:"requested_by"`
	Accepted     time.Time     `json:"accepted"`
	Started      *time.Time    `json:"started,omitempty"`
	Finished     *time.Time    `json:"finished,omitempty"`
	State        string        `json:"state"`
	Reason       string        `json:"reason,omitempty"`
	Attempts     int           `json:"attempts"`
}

type operationListJSON struct {
	Operations []operationJSON `json:"operations"`
	NextCursor string          `json:"next_cursor,omitempty"`
}

func toOperation(op *dbcloud.Operation) operationJSON {
	return operationJSON{
		ID: op.ID, Type: string(op.Type), ResourceID: op.ResourceID, ResourceType: dbcloud.ResourceKindOf(op.Type),
		RequestedBy: requesterJSON(op.RequestedBy), Accepted: op.Created, Started: op.Started, Finished: op.Finished,
		State: string(op.State), Reason: op.Error, Attempts: op.Attempts,
	}
}

type snapshotJSON struct {
	Name      string    `json:"name"`
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	SizeBytes int64     `json:"size_bytes"`
	Timeline  uint32    `json:"timeline"`
	StartLSN  string    `json:"start_lsn"`
	StopLSN   string    `json:"stop_lsn"`
	PITRBase  bool      `json:"pitr_base"`
}

type recoveryWindowJSON struct {
	LastSnapshot *time.Time `json:"last_snapshot,omitempty"`
	PITRFrom     *time.Time `json:"pitr_from,omitempty"`
	PITRTo       *time.Time `json:"pitr_to,omitempty"`
	Stopped      bool       `json:"stopped"`
}

type snapshotListJSON struct {
	Snapshots        []snapshotJSON     `json:"snapshots"`
	RecoveryWindow   recoveryWindowJSON `json:"recovery_window"`
	LastRestoreCheck *restoreCheckJSON  `json:"last_restore_check,omitempty"`
}

type restoreCheckJSON struct {
	Snapshot    string    `json:"snapshot"`
	Started     time.Time `json:"started"`
	DurationMS  int64     `json:"duration_ms"`
	OK          bool      `json:"ok"`
	Error       string    `json:"error,omitempty"`
	RestoredLSN string    `json:"restored_lsn,omitempty"`
	ExpectedLSN string    `json:"expected_lsn,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func toSnapshot(s *dbcloud.SnapshotInfo) snapshotJSON {
	return snapshotJSON{Name: s.Name, Started: s.Started, Finished: s.Finished, SizeBytes: s.Bytes,
		Timeline: s.Timeline, StartLSN: s.StartLSN, StopLSN: s.StopLSN, PITRBase: s.PITRBase}
}

type eventJSON struct {
	ID             int64         `json:"id"`
	Type           string        `json:"type"`
	Time           time.Time     `json:"time"`
	ResourceType   string        `json:"resource_type"`
	ResourceID     string        `json:"resource_id"`
	Status         string        `json:"status,omitempty"`
	PreviousStatus string        `json:"previous_status,omitempty"`
	Reason         string        `json:"reason,omitempty"`
	OperationID    string        `json:"operation_id,omitempty"`
	OperationType  string        `json:"operation_type,omitempty"`
	Outcome        string        `json:"outcome,omitempty"`
	Primary        string        `json:"primary,omitempty"`
	Snapshot       *snapshotJSON `json:"snapshot,omitempty"`
}

func toEvent(e *dbcloud.Event) eventJSON {
	out := eventJSON{
		ID: e.ID, Type: string(e.Type), Time: e.Time, ResourceType: e.ResourceKind, ResourceID: e.ResourceID,
		Status: e.Status, PreviousStatus: e.PreviousStatus, Reason: e.Reason, OperationID: e.OperationID,
		OperationType: string(e.OperationType), Outcome: e.Outcome, Primary: e.Primary,
	}
	if e.Snapshot != nil {
		s := toSnapshot(e.Snapshot)
		out.Snapshot = &s
	}
	return out
}

// operationHeaders names the operation a request recorded: Operation-Id,
// and Operation-Location, the URL that shows its progress and outcome.
func operationHeaders(w http.ResponseWriter, r *http.Request, log *cloud.OperationLog) {
	if log.ID == "" {
		return
	}
	w.Header().Set("Operation-Id", log.ID)
	w.Header().Set("Operation-Location", BasePath+"/projects/"+r.PathValue("project_id")+"/operations/"+log.ID)
}

func (h *Handler) listOperations(scope func(r *http.Request) cloud.OperationScope) handlerFn {
	return func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		limit := 0
		if s := r.URL.Query().Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > cloud.MaxOperationPage {
				return 0, nil, dbcloud.Errorf(dbcloud.KindInvalid, "limit must be a whole number from 1 to %d, got %q.", cloud.MaxOperationPage, s)
			}
			limit = n
		}
		page, err := h.cloud.ListOperations(r.Context(), r.PathValue("project_id"), scope(r), r.URL.Query().Get("cursor"), limit)
		if err != nil {
			return 0, nil, err
		}
		out := operationListJSON{Operations: make([]operationJSON, len(page.Operations)), NextCursor: page.Next}
		for i, op := range page.Operations {
			out.Operations[i] = toOperation(op)
		}
		return http.StatusOK, out, nil
	}
}

func serviceScope(r *http.Request) cloud.OperationScope {
	return cloud.OperationScope{ServiceID: r.PathValue("service_id")}
}

func replicaSetScope(r *http.Request) cloud.OperationScope {
	return cloud.OperationScope{ServiceID: r.PathValue("service_id"), ReplicaSetID: r.PathValue("replica_set_id")}
}

func vpcScope(r *http.Request) cloud.OperationScope {
	return cloud.OperationScope{VPCID: r.PathValue("vpc_id")}
}

func peeringScope(r *http.Request) cloud.OperationScope {
	return cloud.OperationScope{VPCID: r.PathValue("vpc_id"), PeeringID: r.PathValue("peering_id")}
}

func (h *Handler) getOperation(w http.ResponseWriter, r *http.Request) (int, any, error) {
	op, err := h.cloud.GetOperation(r.Context(), r.PathValue("project_id"), r.PathValue("operation_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toOperation(op), nil
}

func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request) (int, any, error) {
	l, err := h.cloud.ListSnapshots(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"))
	if err != nil {
		return 0, nil, err
	}
	out := snapshotListJSON{Snapshots: make([]snapshotJSON, len(l.Snapshots)), RecoveryWindow: recoveryWindowJSON{
		LastSnapshot: timePtr(l.Window.LastSnapshot), PITRFrom: timePtr(l.Window.From), PITRTo: timePtr(l.Window.To),
		Stopped: l.Window.Stopped,
	}}
	for i := range l.Snapshots {
		out.Snapshots[i] = toSnapshot(&l.Snapshots[i])
	}
	if c := l.LastCheck; c != nil {
		out.LastRestoreCheck = &restoreCheckJSON{Snapshot: c.Snapshot, Started: c.Started, DurationMS: c.Duration.Milliseconds(),
			OK: c.OK, Error: c.Error, RestoredLSN: c.RestoredLSN, ExpectedLSN: c.ExpectedLSN}
	}
	return http.StatusOK, out, nil
}

// Event stream timing: how often a follower reads the store for events
// of other processes sharing it, and how often an idle stream sends a
// comment so that proxies and clients see it alive.
const (
	eventPoll      = time.Second
	eventHeartbeat = 15 * time.Second
)

// events streams the project's events as Server-Sent Events, from after
// the Last-Event-ID header (or the after parameter; 0, the oldest kept, if
// neither), until the client leaves or the server shuts down.
func (h *Handler) events(w http.ResponseWriter, r *http.Request) (int, any, error) {
	ctx, projectID := r.Context(), r.PathValue("project_id")
	after, err := lastEventID(r)
	if err != nil {
		return 0, nil, err
	}
	release, err := h.limits.openStream(cloud.PrincipalFromContext(ctx).ID())
	if err != nil {
		return 0, nil, err
	}
	defer release()
	// The first read happens before the headers, so a refusal is an
	// ordinary error response.
	evs, err := h.cloud.ListEvents(ctx, projectID, after, cloud.MaxEventPage)
	if err != nil {
		return 0, nil, err
	}
	rc := http.NewResponseController(w)
	// A stream outlives the server's write timeout, which is for replies.
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "retry: %d\n\n", eventPoll.Milliseconds())
	poll, beat := time.NewTicker(eventPoll), time.NewTicker(eventHeartbeat)
	defer poll.Stop()
	defer beat.Stop()
	for {
		for _, e := range evs {
			b, err := json.Marshal(toEvent(e))
			if err != nil {
				return streamed, nil, nil
			}
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.ID, e.Type, b); err != nil {
				return streamed, nil, nil
			}
			after = e.ID
		}
		if err := rc.Flush(); err != nil {
			return streamed, nil, nil
		}
		if len(evs) < cloud.MaxEventPage {
			changed := h.cloud.EventsChanged()
		wait:
			for {
				select {
				case <-ctx.Done():
					return streamed, nil, nil
				case <-h.shutdown():
					return streamed, nil, nil
				case <-changed:
					break wait
				case <-poll.C:
					break wait
				case <-beat.C:
					if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil || rc.Flush() != nil {
						return streamed, nil, nil
					}
				}
			}
		}
		if evs, err = h.cloud.ListEvents(ctx, projectID, after, cloud.MaxEventPage); err != nil {
			if ctx.Err() == nil {
				h.logger.Warn("read events", "project", projectID, "error", err)
			}
			return streamed, nil, nil
		}
	}
}

// lastEventID is where a stream resumes: the Last-Event-ID header an SSE
// client sends when it reconnects, else the after parameter.
func lastEventID(r *http.Request) (int64, error) {
	s, what := r.Header.Get("Last-Event-ID"), "Last-Event-ID"
	if s == "" {
		s, what = r.URL.Query().Get("after"), "after"
	}
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, dbcloud.Errorf(dbcloud.KindInvalid, "%s must be the ID of an event (a whole number), got %q.", what, s)
	}
	return n, nil
}

// Unwrap lets http.ResponseController reach the connection, to flush a
// stream and lift its write deadline.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
