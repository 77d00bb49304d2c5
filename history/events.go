package history

import (
	"context"
	"sync"
	"time"

	"dbcloud"
)

// EventStore wraps a Store so that every change a client may follow is
// recorded as an Event in the same transaction as the change: an event is
// never reported for a change that did not commit, and never lost for one
// that did. The domain and the engine write through it unaware.
type EventStore struct {
	dbcloud.Store
	now func() time.Time

	mu      sync.Mutex
	changed chan struct{}
}

// NewEventStore returns s recording events.
func NewEventStore(s dbcloud.Store) *EventStore {
	return &EventStore{Store: s, now: time.Now, changed: make(chan struct{})}
}

// Update runs fn in a write transaction that records events.
func (s *EventStore) Update(ctx context.Context, fn func(dbcloud.Tx) error) error {
	etx := &eventTx{Tx: nil, now: func() time.Time { return s.now().UTC().Truncate(time.Microsecond) }}
	err := s.Store.Update(ctx, func(tx dbcloud.Tx) error {
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
func (s *EventStore) Unwrap() dbcloud.Store { return s.Store }

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
	dbcloud.Tx
	now func() time.Time
	// events are inserted, in order, when the transaction's work is done.
	events []*dbcloud.Event
	// restores are the forks whose create ended; their events follow the
	// others, with the status the fork has once the transaction is done.
	restores []*dbcloud.Event
}

// settleRestores completes the restore events with the fork's final status
// and queues them last.
func (t *eventTx) settleRestores() error {
	for _, e := range t.restores {
		s, err := t.Tx.FindService(e.ProjectID, e.ResourceID)
		if dbcloud.IsNotFound(err) {
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

func (t *eventTx) emit(e *dbcloud.Event) error {
	e.Time = t.now()
	t.events = append(t.events, e)
	return nil
}

// InsertEvent records an event written by the caller itself, with the
// others at the end of the transaction; its ID is set then.
func (t *eventTx) InsertEvent(e *dbcloud.Event) error {
	if e.Time.IsZero() {
		e.Time = t.now()
	}
	t.events = append(t.events, e)
	return nil
}

func (t *eventTx) InsertService(s *dbcloud.Service) error {
	if err := t.Tx.InsertService(s); err != nil {
		return err
	}
	return t.emit(&dbcloud.Event{ProjectID: s.ProjectID, Type: dbcloud.EventServiceStatus, ResourceKind: "service", ResourceID: s.ID,
		Status: string(s.Status), Reason: s.StatusReason})
}

func (t *eventTx) UpdateService(s *dbcloud.Service) error {
	old, err := t.Tx.FindService(s.ProjectID, s.ID)
	if err != nil {
		return err
	}
	if err := t.Tx.UpdateService(s); err != nil {
		return err
	}
	if old.Status != s.Status {
		if err := t.emit(&dbcloud.Event{ProjectID: s.ProjectID, Type: dbcloud.EventServiceStatus, ResourceKind: "service", ResourceID: s.ID,
			Status: string(s.Status), PreviousStatus: string(old.Status), Reason: s.StatusReason}); err != nil {
			return err
		}
	} else if s.Status == dbcloud.StatusReady && old.StatusReason != s.StatusReason {
		if err := t.emit(&dbcloud.Event{ProjectID: s.ProjectID, Type: dbcloud.EventServiceNotice, ResourceKind: "service", ResourceID: s.ID,
			Status: string(s.Status), Reason: s.StatusReason}); err != nil {
			return err
		}
	}
	if was, is := primaryOf(old), primaryOf(s); was != "" && is != "" && was != is {
		return t.emit(&dbcloud.Event{ProjectID: s.ProjectID, Type: dbcloud.EventFailover, ResourceKind: "service", ResourceID: s.ID,
			Status: string(s.Status), Primary: is, Reason: "Instance " + is + " replaced " + was + " as the primary."})
	}
	return nil
}

// primaryOf is the ID of the service's observed primary, "" if none.
func primaryOf(s *dbcloud.Service) string {
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
	return t.emit(&dbcloud.Event{ProjectID: projectID, Type: dbcloud.EventServiceStatus, ResourceKind: "service", ResourceID: id,
		Status: string(dbcloud.StatusDeleted), PreviousStatus: string(dbcloud.StatusDeleting)})
}

func (t *eventTx) InsertReplicaSet(r *dbcloud.ReadReplicaSet) error {
	if err := t.Tx.InsertReplicaSet(r); err != nil {
		return err
	}
	return t.emit(&dbcloud.Event{ProjectID: r.ProjectID, Type: dbcloud.EventReplicaSetStatus, ResourceKind: "replica_set", ResourceID: r.ID,
		Status: string(r.Status), Reason: r.StatusReason})
}

func (t *eventTx) UpdateReplicaSet(r *dbcloud.ReadReplicaSet) error {
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
	return t.emit(&dbcloud.Event{ProjectID: r.ProjectID, Type: dbcloud.EventReplicaSetStatus, ResourceKind: "replica_set", ResourceID: r.ID,
		Status: string(r.Status), PreviousStatus: string(old.Status), Reason: r.StatusReason})
}

func (t *eventTx) DeleteReplicaSet(projectID, id string) error {
	if err := t.Tx.DeleteReplicaSet(projectID, id); err != nil {
		return err
	}
	return t.emit(&dbcloud.Event{ProjectID: projectID, Type: dbcloud.EventReplicaSetStatus, ResourceKind: "replica_set", ResourceID: id,
		Status: "deleted", PreviousStatus: string(dbcloud.ReplicaSetDeleting)})
}

func (t *eventTx) InsertPeering(p *dbcloud.Peering) error {
	if err := t.Tx.InsertPeering(p); err != nil {
		return err
	}
	return t.emit(&dbcloud.Event{ProjectID: p.ProjectID, Type: dbcloud.EventPeeringStatus, ResourceKind: "peering", ResourceID: p.ID,
		Status: string(p.Status)})
}

func (t *eventTx) UpdatePeering(p *dbcloud.Peering) error {
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
	return t.emit(&dbcloud.Event{ProjectID: p.ProjectID, Type: dbcloud.EventPeeringStatus, ResourceKind: "peering", ResourceID: p.ID,
		Status: string(p.Status), PreviousStatus: string(old.Status), Reason: p.ErrorMessage})
}

func (t *eventTx) InsertOperation(op *dbcloud.Operation) error {
	if err := t.Tx.InsertOperation(op); err != nil {
		return err
	}
	if !op.State.Terminal() {
		return nil
	}
	return t.operationEnded(op)
}

func (t *eventTx) UpdateOperation(op *dbcloud.Operation) error {
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

func (t *eventTx) operationEnded(op *dbcloud.Operation) error {
	err := t.emit(&dbcloud.Event{ProjectID: op.ProjectID, Type: dbcloud.EventOperationFinished, ResourceKind: op.Type.ResourceKind(),
		ResourceID: op.ResourceID, OperationID: op.ID, OperationType: op.Type, Outcome: string(op.State), Reason: op.Error})
	if err != nil || op.Type != dbcloud.OpCreateService || op.State == dbcloud.OpSuperseded {
		return err
	}
	// A fork's create ends with its restore: report that as such too
	// (settleRestores keeps only forks).
	t.restores = append(t.restores, &dbcloud.Event{ProjectID: op.ProjectID, Type: dbcloud.EventRestoreFinished, ResourceKind: "service",
		ResourceID: op.ResourceID, Time: t.now(), Outcome: string(op.State), Reason: op.Error, OperationID: op.ID, OperationType: op.Type})
	return nil
}
