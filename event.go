package dbcloud

import (
	"context"
	"sync"
	"time"
)

// EventType names what an Event reports.
type EventType string

// Event types. A client follows a project through these instead of polling.
const (
	// EventServiceStatus: a service's status changed (DELETED when it is gone).
	EventServiceStatus EventType = "service.status"
	// EventFailover: another instance became a service's primary.
	EventFailover EventType = "service.failover"
	// EventReplicaSetStatus: a read replica set's status changed.
	EventReplicaSetStatus EventType = "replica_set.status"
	// EventPeeringStatus: a VPC peering's status changed.
	EventPeeringStatus EventType = "peering.status"
	// EventOperationFinished: an operation reached a terminal state.
	EventOperationFinished EventType = "operation.finished"
	// EventRestoreFinished: a fork's restore from its parent's snapshot
	// (and WAL) ended, successfully or not.
	EventRestoreFinished EventType = "restore.finished"
	// EventSnapshotTaken and EventSnapshotFailed: a scheduled snapshot of a
	// service was completed or failed.
	EventSnapshotTaken  EventType = "snapshot.completed"
	EventSnapshotFailed EventType = "snapshot.failed"
	// EventServiceNotice: what a READY service's status_reason says
	// changed (near or at its storage limit, a failed restore check, or
	// cleared: an empty reason).
	EventServiceNotice EventType = "service.notice"
	// EventRestoreChecked: a verified restore of a service's newest
	// snapshot ended; Status is "ok" or "failed", Reason what failed.
	EventRestoreChecked EventType = "restore_check.finished"
)

// Event is one thing that happened in a project. IDs increase by one per
// project in commit order, so a client that saw event N resumes after N
// (Last-Event-ID) and misses nothing, also across a restart of dbcloud.
type Event struct {
	ID           int64     `json:"id"`
	ProjectID    string    `json:"project_id"`
	Type         EventType `json:"type"`
	Time         time.Time `json:"time"`
	ResourceKind string    `json:"resource_kind"`
	ResourceID   string    `json:"resource_id"`
	// Status and PreviousStatus are set for status changes and for
	// restores (the fork's status).
	Status         string `json:"status,omitempty"`
	PreviousStatus string `json:"previous_status,omitempty"`
	// Reason is the status reason, or an operation's or snapshot's error.
	Reason string `json:"reason,omitempty"`
	// OperationID, OperationType and Outcome are set for operation ends.
	OperationID   string        `json:"operation_id,omitempty"`
	OperationType OperationType `json:"operation_type,omitempty"`
	Outcome       string        `json:"outcome,omitempty"`
	// Primary is the new primary instance of a failover.
	Primary string `json:"primary,omitempty"`
	// Snapshot describes a snapshot event, or the snapshot a restore used.
	Snapshot *SnapshotInfo `json:"snapshot,omitempty"`
}

// EventStore wraps a Store so that every change a client may follow is
// recorded as an Event in the same transaction as the change: an event is
// never reported for a change that did not commit, and never lost for one
// that did. The domain and the engine write through it unaware.
type EventStore struct {
	Store
	now func() time.Time

	mu      sync.Mutex
	changed chan struct{}
}

// NewEventStore returns s recording events.
func NewEventStore(s Store) *EventStore {
	return &EventStore{Store: s, now: time.Now, changed: make(chan struct{})}
}

// Update runs fn in a write transaction that records events.
func (s *EventStore) Update(ctx context.Context, fn func(Tx) error) error {
	etx := &eventTx{Tx: nil, now: func() time.Time { return s.now().UTC().Truncate(time.Microsecond) }}
	err := s.Store.Update(ctx, func(tx Tx) error {
		etx.Tx, etx.events, etx.restores = tx, nil, nil
		if err := fn(etx); err != nil {
			return err
		}
		// Events go in last. Their project's counter row is then the last
		// lock the transaction takes, so a transaction holding it never
		// waits for another: no lock cycle with a writer that locked a
		// service first.
		if err := etx.settleRestores(); err != nil {
			return err
		}
		for _, e := range etx.events {
			if err := tx.InsertEvent(e); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && len(etx.events) > 0 {
		s.mu.Lock()
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}
	return err
}

// Unwrap returns the store s records events into, for what it offers
// beyond Store (the metrics series of SeriesStore), which has no events.
func (s *EventStore) Unwrap() Store { return s.Store }

// UnwrapStore returns the innermost store under wrappers such as
// EventStore.
func UnwrapStore(s Store) Store {
	for {
		u, ok := s.(interface{ Unwrap() Store })
		if !ok {
			return s
		}
		s = u.Unwrap()
	}
}

// Changed returns a channel closed at the next commit that records an
// event in this process. Other processes sharing the store are seen by
// reading it again, so a follower also reads on a timer.
func (s *EventStore) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// eventTx is a transaction that adds an event to each change worth one.
type eventTx struct {
	Tx
	now func() time.Time
	// events are inserted, in order, when the transaction's work is done.
	events []*Event
	// restores are the forks whose create ended; their events follow the
	// others, with the status the fork has once the transaction is done.
	restores []*Event
}

// settleRestores completes the restore events with the fork's final status
// and queues them last.
func (t *eventTx) settleRestores() error {
	for _, e := range t.restores {
		s, err := t.Tx.FindService(e.ProjectID, e.ResourceID)
		if IsNotFound(err) {
			continue
		} else if err != nil {
			return err
		}
		if s.Fork == nil {
			continue
		}
		e.Status = string(s.Status)
		if e.Reason == "" {
			e.Reason = s.StatusReason
		}
		t.events = append(t.events, e)
	}
	return nil
}

func (t *eventTx) emit(e *Event) error {
	e.Time = t.now()
	t.events = append(t.events, e)
	return nil
}

// InsertEvent records an event written by the caller itself, with the
// others at the end of the transaction; its ID is set then.
func (t *eventTx) InsertEvent(e *Event) error {
	if e.Time.IsZero() {
		e.Time = t.now()
	}
	t.events = append(t.events, e)
	return nil
}

func (t *eventTx) InsertService(s *Service) error {
	if err := t.Tx.InsertService(s); err != nil {
		return err
	}
	return t.emit(&Event{ProjectID: s.ProjectID, Type: EventServiceStatus, ResourceKind: "service", ResourceID: s.ID,
		Status: string(s.Status), Reason: s.StatusReason})
}

func (t *eventTx) UpdateService(s *Service) error {
	old, err := t.Tx.FindService(s.ProjectID, s.ID)
	if err != nil {
		return err
	}
	if err := t.Tx.UpdateService(s); err != nil {
		return err
	}
	if old.Status != s.Status {
		if err := t.emit(&Event{ProjectID: s.ProjectID, Type: EventServiceStatus, ResourceKind: "service", ResourceID: s.ID,
			Status: string(s.Status), PreviousStatus: string(old.Status), Reason: s.StatusReason}); err != nil {
			return err
		}
	} else if s.Status == StatusReady && old.StatusReason != s.StatusReason {
		if err := t.emit(&Event{ProjectID: s.ProjectID, Type: EventServiceNotice, ResourceKind: "service", ResourceID: s.ID,
			Status: string(s.Status), Reason: s.StatusReason}); err != nil {
			return err
		}
	}
	if was, is := primaryOf(old), primaryOf(s); was != "" && is != "" && was != is {
		return t.emit(&Event{ProjectID: s.ProjectID, Type: EventFailover, ResourceKind: "service", ResourceID: s.ID,
			Status: string(s.Status), Primary: is, Reason: "Instance " + is + " replaced " + was + " as the primary."})
	}
	return nil
}

// primaryOf is the ID of the service's observed primary, "" if none.
func primaryOf(s *Service) string {
	for _, in := range s.Instances {
		if in.Role == "primary" {
			return in.ID
		}
	}
	return ""
}

func (t *eventTx) DeleteService(projectID, id string) error {
	if err := t.Tx.DeleteService(projectID, id); err != nil {
		return err
	}
	return t.emit(&Event{ProjectID: projectID, Type: EventServiceStatus, ResourceKind: "service", ResourceID: id,
		Status: string(StatusDeleted), PreviousStatus: string(StatusDeleting)})
}

func (t *eventTx) InsertReplicaSet(r *ReadReplicaSet) error {
	if err := t.Tx.InsertReplicaSet(r); err != nil {
		return err
	}
	return t.emit(&Event{ProjectID: r.ProjectID, Type: EventReplicaSetStatus, ResourceKind: "replica_set", ResourceID: r.ID,
		Status: string(r.Status), Reason: r.StatusReason})
}

func (t *eventTx) UpdateReplicaSet(r *ReadReplicaSet) error {
	old, err := t.Tx.FindReplicaSet(r.ProjectID, r.ID)
	if err != nil {
		return err
	}
	if err := t.Tx.UpdateReplicaSet(r); err != nil {
		return err
	}
	if old.Status == r.Status {
		return nil
	}
	return t.emit(&Event{ProjectID: r.ProjectID, Type: EventReplicaSetStatus, ResourceKind: "replica_set", ResourceID: r.ID,
		Status: string(r.Status), PreviousStatus: string(old.Status), Reason: r.StatusReason})
}

func (t *eventTx) DeleteReplicaSet(projectID, id string) error {
	if err := t.Tx.DeleteReplicaSet(projectID, id); err != nil {
		return err
	}
	return t.emit(&Event{ProjectID: projectID, Type: EventReplicaSetStatus, ResourceKind: "replica_set", ResourceID: id,
		Status: "deleted", PreviousStatus: string(ReplicaSetDeleting)})
}

func (t *eventTx) InsertPeering(p *Peering) error {
	if err := t.Tx.InsertPeering(p); err != nil {
		return err
	}
	return t.emit(&Event{ProjectID: p.ProjectID, Type: EventPeeringStatus, ResourceKind: "peering", ResourceID: p.ID,
		Status: string(p.Status)})
}

func (t *eventTx) UpdatePeering(p *Peering) error {
	old, err := t.Tx.FindPeering(p.VPCID, p.ID)
	if err != nil {
		return err
	}
	if err := t.Tx.UpdatePeering(p); err != nil {
		return err
	}
	if old.Status == p.Status {
		return nil
	}
	return t.emit(&Event{ProjectID: p.ProjectID, Type: EventPeeringStatus, ResourceKind: "peering", ResourceID: p.ID,
		Status: string(p.Status), PreviousStatus: string(old.Status), Reason: p.ErrorMessage})
}

func (t *eventTx) InsertOperation(op *Operation) error {
	if err := t.Tx.InsertOperation(op); err != nil {
		return err
	}
	if !op.State.Terminal() {
		return nil
	}
	return t.operationEnded(op)
}

func (t *eventTx) UpdateOperation(op *Operation) error {
	old, err := t.Tx.FindOperation(op.ID)
	if err != nil {
		return err
	}
	if err := t.Tx.UpdateOperation(op); err != nil {
		return err
	}
	if old.State.Terminal() || !op.State.Terminal() {
		return nil
	}
	return t.operationEnded(op)
}

func (t *eventTx) operationEnded(op *Operation) error {
	err := t.emit(&Event{ProjectID: op.ProjectID, Type: EventOperationFinished, ResourceKind: op.Type.resourceKind(),
		ResourceID: op.ResourceID, OperationID: op.ID, OperationType: op.Type, Outcome: string(op.State), Reason: op.Error})
	if err != nil || op.Type != OpCreateService || op.State == OpSuperseded {
		return err
	}
	// A fork's create ends with its restore: report that as such too
	// (settleRestores keeps only forks).
	t.restores = append(t.restores, &Event{ProjectID: op.ProjectID, Type: EventRestoreFinished, ResourceKind: "service",
		ResourceID: op.ResourceID, Time: t.now(), Outcome: string(op.State), Reason: op.Error, OperationID: op.ID, OperationType: op.Type})
	return nil
}

// ResourceKindOf is the kind of resource an operation of type t acts on:
// service, replica_set or peering.
func ResourceKindOf(t OperationType) string { return t.resourceKind() }

func (t OperationType) resourceKind() string {
	switch t {
	case OpCreateReplicaSet, OpDeleteReplicaSet, OpResizeReplicaSet, OpSetReplicaPooler:
		return "replica_set"
	case OpCreatePeering, OpDeletePeering:
		return "peering"
	case OpCreateService, OpDeleteService, OpStartService, OpStopService, OpResizeService, OpSetHA,
		OpSetPooler, OpAttachVPC, OpDetachVPC, OpFailover, OpRestartPrimary:
		return "service"
	}
	return "service"
}
