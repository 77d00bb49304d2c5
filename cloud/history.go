package cloud

import (
	"context"

	"dbcloud"
)

// Paging bounds of operation lists and event reads.
const (
	DefaultOperationPage = 100
	MaxOperationPage     = 500
	MaxEventPage         = 500
)

// OperationPage is a page of a resource's operations, newest first. Next,
// when set, is the cursor of the next (older) page.
type OperationPage struct {
	Operations []*dbcloud.Operation
	Next       string
}

// OperationScope names the resource whose operations are listed: a service
// (with its read replica sets), a read replica set, a VPC (with its
// peerings) or a peering. IDs not needed for the kind are "".
type OperationScope struct {
	ServiceID, ReplicaSetID, VPCID, PeeringID string
}

// ListOperations lists the operations accepted for a resource, newest
// first, limit per page (0: the default), starting after the operation
// before names ("" for the newest).
func (c *Cloud) ListOperations(ctx context.Context, projectID string, scope OperationScope, before string, limit int) (*OperationPage, error) {
	switch {
	case limit == 0:
		limit = DefaultOperationPage
	case limit < 1 || limit > MaxOperationPage:
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "limit must be 1 to %d, got %d.", MaxOperationPage, limit)
	}
	page := &OperationPage{}
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) error {
		f, err := operationFilter(tx, projectID, scope)
		if err != nil {
			return err
		}
		if before != "" {
			b, err := tx.FindOperation(before)
			if dbcloud.IsNotFound(err) || (err == nil && !inScope(b, projectID, f)) {
				return dbcloud.Errorf(dbcloud.KindInvalid, "before %q is not an operation of this resource; use the next cursor of a previous page.", before)
			} else if err != nil {
				return err
			}
			f.Before = b
		}
		f.Newest, f.Limit = true, limit+1
		ops, err := tx.ListOperations(f)
		if err != nil {
			return err
		}
		if len(ops) > limit {
			ops = ops[:limit]
			page.Next = ops[limit-1].ID
		}
		page.Operations = ops
		return nil
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// operationFilter checks that the scope's resource exists in the project
// and returns the filter of its operations.
func operationFilter(tx dbcloud.Tx, projectID string, s OperationScope) (dbcloud.OperationFilter, error) {
	switch {
	case s.ReplicaSetID != "":
		if _, err := findReplicaSet(tx, projectID, s.ServiceID, s.ReplicaSetID); err != nil {
			return dbcloud.OperationFilter{}, err
		}
		return dbcloud.OperationFilter{ResourceID: s.ReplicaSetID}, nil
	case s.ServiceID != "":
		if _, err := findService(tx, projectID, s.ServiceID); err != nil {
			return dbcloud.OperationFilter{}, err
		}
		return dbcloud.OperationFilter{Subject: s.ServiceID}, nil
	case s.PeeringID != "":
		if _, err := findPeering(tx, projectID, s.VPCID, s.PeeringID); err != nil {
			return dbcloud.OperationFilter{}, err
		}
		return dbcloud.OperationFilter{ResourceID: s.PeeringID}, nil
	}
	if _, err := findVPC(tx, projectID, s.VPCID); err != nil {
		return dbcloud.OperationFilter{}, err
	}
	return dbcloud.OperationFilter{Subject: s.VPCID}, nil
}

func inScope(op *dbcloud.Operation, projectID string, f dbcloud.OperationFilter) bool {
	if op.ProjectID != projectID {
		return false
	}
	if f.ResourceID != "" {
		return op.ResourceID == f.ResourceID
	}
	return op.ResourceID == f.Subject || op.ParentID == f.Subject
}

// ListEvents returns up to limit events of the project after the event
// ID after, oldest first.
func (c *Cloud) ListEvents(ctx context.Context, projectID string, after int64, limit int) ([]*dbcloud.Event, error) {
	if limit < 1 || limit > MaxEventPage {
		limit = MaxEventPage
	}
	var out []*dbcloud.Event
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		out, err = tx.ListEvents(projectID, after, limit)
		return err
	})
	return out, err
}

// EventsChanged returns a channel closed when this process next records an
// event, or nil when the store does not tell (followers then poll).
func (c *Cloud) EventsChanged() <-chan struct{} {
	if s, ok := c.Store.(interface{ Changed() <-chan struct{} }); ok {
		return s.Changed()
	}
	return nil
}

// PurgeHistory forgets finished operations and events older than
// HistoryRetention, so the history stays bounded.
func (c *Cloud) PurgeHistory(ctx context.Context) (ops, events int, err error) {
	before := c.now().Add(-dbcloud.HistoryRetention)
	err = c.Store.Update(ctx, func(tx dbcloud.Tx) (err error) {
		if ops, err = tx.DeleteOperationsBefore(before); err != nil {
			return err
		}
		events, err = tx.DeleteEventsBefore(before)
		return err
	})
	return ops, events, err
}

// SnapshotList is what a service's forks can restore, and whether that
// was last proven.
type SnapshotList struct {
	Snapshots []dbcloud.SnapshotInfo
	Window    dbcloud.RecoveryWindow
	LastCheck *dbcloud.RestoreCheck
}

// ListSnapshots lists the service's snapshots and its recovery window.
func (c *Cloud) ListSnapshots(ctx context.Context, projectID, serviceID string) (*SnapshotList, error) {
	var svc *dbcloud.Service
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		svc, err = findService(tx, projectID, serviceID)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := &SnapshotList{Snapshots: []dbcloud.SnapshotInfo{}}
	caps := dbcloud.CapabilitiesOf(c.Runtime)
	if l := caps.Snapshots; l != nil {
		if out.Snapshots, err = l.Snapshots(ctx, svc); err != nil {
			return nil, err
		}
		if out.Snapshots == nil {
			out.Snapshots = []dbcloud.SnapshotInfo{}
		}
	}
	if b := caps.Backups; b != nil {
		if out.Window, err = b.RecoveryWindow(ctx, svc); err != nil {
			return nil, err
		}
	}
	if rc := caps.RestoreChecks; rc != nil {
		if out.LastCheck, err = rc.LastRestoreCheck(svc); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// GetOperation returns one operation of the project.
func (c *Cloud) GetOperation(ctx context.Context, projectID, id string) (*dbcloud.Operation, error) {
	var op *dbcloud.Operation
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		op, err = tx.FindOperation(id)
		if dbcloud.IsNotFound(err) || (err == nil && op.ProjectID != projectID) {
			return dbcloud.Errorf(dbcloud.KindNotFound, "Operation %q not found.", id)
		}
		return err
	})
	return op, err
}
