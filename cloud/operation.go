package cloud

import (
	"context"
	"fmt"

	"dbcloud"
)

// requesterOf is the principal of ctx as an operation records it.
func requesterOf(ctx context.Context) dbcloud.Requester {
	p := PrincipalFromContext(ctx)
	if p == nil {
		return dbcloud.Requester{System: "dbcloud"}
	}
	var r dbcloud.Requester
	if p.Key != nil {
		r.AccessKey = p.Key.AccessKey
	}
	if p.User != nil {
		r.UserID, r.UserEmail = p.User.ID, p.User.Email
	}
	if p.Key == nil && p.User == nil {
		r.System = operatorRequester // OperatorContext
	}
	return r
}

// operationLogKey carries the IDs of the operations a request recorded.
type operationLogKey struct{}

// OperationLog holds the operation a request recorded, so that the
// transport can name it in its response (Operation-Id). A transaction that
// is retried records again, so the last ID is the committed one.
type OperationLog struct{ ID, ResourceID string }

// NewContextWithOperationLog returns ctx collecting into log the operations
// the request records.
func NewContextWithOperationLog(ctx context.Context, log *OperationLog) context.Context {
	return context.WithValue(ctx, operationLogKey{}, log)
}

// OperationLogFromContext returns the log NewContextWithOperationLog put
// into ctx, or nil.
func OperationLogFromContext(ctx context.Context) *OperationLog {
	l, _ := ctx.Value(operationLogKey{}).(*OperationLog)
	return l
}

func logOperation(ctx context.Context, op *dbcloud.Operation) {
	if l, _ := ctx.Value(operationLogKey{}).(*OperationLog); l != nil {
		l.ID, l.ResourceID = op.ID, op.ResourceID
	}
}

// supersedePending ends the resource's pending operations: a delete makes
// them moot, and the engine then works on the delete alone.
func (c *Cloud) supersedePending(tx dbcloud.Tx, resourceID string) error {
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: resourceID, Pending: true})
	if err != nil {
		return err
	}
	return c.supersede(tx, pending, "superseded by delete")
}

func (c *Cloud) supersede(tx dbcloud.Tx, ops []*dbcloud.Operation, why string) error {
	for _, op := range ops {
		op.Finish(dbcloud.OpSuperseded, why, c.now())
		if err := tx.UpdateOperation(op); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cloud) insertOperation(ctx context.Context, tx dbcloud.Tx, projectID, resourceID string, t dbcloud.OperationType, gen int64) error {
	return c.insertChildOperation(ctx, tx, projectID, "", resourceID, t, gen)
}

// insertChildOperation records an operation on a resource that belongs to
// parentID (a read replica set's service, a peering's VPC), so that the
// parent's operation list shows it too.
func (c *Cloud) insertChildOperation(ctx context.Context, tx dbcloud.Tx, projectID, parentID, resourceID string, t dbcloud.OperationType, gen int64) error {
	now := c.now()
	op := &dbcloud.Operation{
		ID: dbcloud.NewID(), ProjectID: projectID, ParentID: parentID, ResourceID: resourceID, Type: t, Generation: gen,
		State: dbcloud.OpPending, Created: now, Updated: now, RequestedBy: requesterOf(ctx),
	}
	if err := tx.InsertOperation(op); err != nil {
		return fmt.Errorf("record %s operation of %s: %w", t, resourceID, err)
	}
	logOperation(ctx, op)
	c.Logger.Info("operation accepted", "operation", op.ID, "type", t, "resource", resourceID, "generation", gen)
	return nil
}
