package engine

import (
	"context"
	"time"

	"dbcloud"
)

// markStartedTx records when the engine first took up each pending
// operation of a resource, for the operation history; it writes only when
// there is one not yet marked.
func markStartedTx(tx dbcloud.Tx, resourceID string, now time.Time) error {
	ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: resourceID, Pending: true})
	if err != nil {
		return err
	}
	for _, op := range ops {
		if op.Started != nil {
			continue
		}
		op.Started = &now
		if err := tx.UpdateOperation(op); err != nil {
			return err
		}
	}
	return nil
}

// repairOperation records, in the transaction that shows the service READY
// again, what the health loop did after its primary was lost: nobody asked
// for it, but a user reading the history must see it.
func repairOperation(tx dbcloud.Tx, svc *dbcloud.Service, failedOver bool, reason string, began, now time.Time) error {
	t := dbcloud.OpRestartPrimary
	if failedOver {
		t = dbcloud.OpFailover
	}
	op := &dbcloud.Operation{
		ID: dbcloud.NewID(), ProjectID: svc.ProjectID, ResourceID: svc.ID, Type: t, Generation: svc.Generation,
		State: dbcloud.OpPending, Created: began, Updated: began, Started: &began,
		RequestedBy: dbcloud.Requester{System: "health check"},
	}
	op.Finish(dbcloud.OpSucceeded, reason, now)
	return tx.InsertOperation(op)
}

// primaryID is the ID of the instance observed as primary, "" if none.
func primaryID(instances []dbcloud.Instance) string {
	for _, in := range instances {
		if in.Role == "primary" {
			return in.ID
		}
	}
	return ""
}

// snapshotEvents reports, as events, the snapshots of svc that finished
// after seen, and a snapshot failure when failure is not nil.
func (e *Engine) snapshotEvents(ctx context.Context, l dbcloud.SnapshotLister, svc *dbcloud.Service, seen time.Time, failure error) error {
	var events []*dbcloud.Event
	if l != nil {
		snaps, err := l.Snapshots(ctx, svc)
		if err != nil {
			return err
		}
		for i := range snaps {
			if s := snaps[i]; s.Finished.After(seen) {
				events = append(events, &dbcloud.Event{ProjectID: svc.ProjectID, Type: dbcloud.EventSnapshotTaken,
					ResourceKind: "service", ResourceID: svc.ID, Snapshot: &s})
			}
		}
	}
	if failure != nil {
		events = append(events, &dbcloud.Event{ProjectID: svc.ProjectID, Type: dbcloud.EventSnapshotFailed,
			ResourceKind: "service", ResourceID: svc.ID, Reason: reasonOf(failure)})
	}
	if len(events) == 0 {
		return nil
	}
	return e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		for _, ev := range events {
			if err := tx.InsertEvent(ev); err != nil {
				return err
			}
		}
		return nil
	})
}
