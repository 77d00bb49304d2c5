package cloud

import (
	"context"

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
