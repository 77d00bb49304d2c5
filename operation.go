package dbcloud

import (
	"time"
)

// OperationType names the change an operation makes real.
type OperationType string

// Operation types. Each is recorded with the desired state it realises.
const (
	OpCreateService    OperationType = "create_service"
	OpDeleteService    OperationType = "delete_service"
	OpStartService     OperationType = "start_service"
	OpStopService      OperationType = "stop_service"
	OpResizeService    OperationType = "resize_service"
	OpSetHA            OperationType = "set_ha"
	OpSetPooler        OperationType = "set_pooler"
	OpAttachVPC        OperationType = "attach_vpc"
	OpDetachVPC        OperationType = "detach_vpc"
	OpCreateReplicaSet OperationType = "create_replica_set"
	OpDeleteReplicaSet OperationType = "delete_replica_set"
	OpResizeReplicaSet OperationType = "resize_replica_set"
	OpSetReplicaPooler OperationType = "set_replica_set_pooler"
	OpCreatePeering    OperationType = "create_peering"
	OpDeletePeering    OperationType = "delete_peering"
	// Credentials are made and dropped synchronously (or by the engine's
	// expiry round); their operations are recorded finished, as history.
	OpCreateCredential OperationType = "create_credential"
	OpRevokeCredential OperationType = "revoke_credential"
	OpExpireCredential OperationType = "expire_credential"
)

// OperationState is where an operation is in its life.
type OperationState string

// Operation states.
const (
	OpPending    OperationState = "pending"
	OpSucceeded  OperationState = "succeeded"
	OpFailed     OperationState = "failed"
	OpSuperseded OperationState = "superseded"
)

// Terminal reports whether no more work will be done for the operation.
func (s OperationState) Terminal() bool {
	switch s {
	case OpSucceeded, OpFailed, OpSuperseded:
		return true
	case OpPending:
		return false
	}
	return false
}

// Operation is an accepted asynchronous request. It is written in the same
// transaction as the desired state it asks for, so an accepted request is
// never lost: the engine finishes every pending operation, also after a crash.
type Operation struct {
	ID         string `json:"id"`
	ProjectID  string `json:"project_id"`
	ResourceID string `json:"resource_id"`
	// ParentID is the resource ResourceID belongs to (a read replica set's
	// service, a peering's VPC), "" for services.
	ParentID     string         `json:"parent_id,omitempty"`
	Type         OperationType  `json:"type"`
	Generation   int64          `json:"generation"`
	State        OperationState `json:"state"`
	Error        string         `json:"error,omitempty"`
	Attempts     int            `json:"attempts"`
	Created      time.Time      `json:"created"`
	Updated      time.Time      `json:"updated"`
	LeaseOwner   string         `json:"lease_owner,omitempty"`
	LeaseExpires time.Time      `json:"lease_expires"`
	// RequestedBy is who asked: the API key and its user, or dbcloud
	// itself for work nobody asked for (a failover).
	RequestedBy Requester `json:"requested_by"`
	// Started is when the engine first worked on it; Finished when it
	// reached a terminal state. Nil until then.
	Started  *time.Time `json:"started,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
}

// Requester is who asked for an operation.
type Requester struct {
	AccessKey string `json:"access_key,omitempty"`
	UserID    string `json:"user_id,omitempty"`
	UserEmail string `json:"user_email,omitempty"`
	// System names dbcloud's own component when no client asked.
	System string `json:"system,omitempty"`
}

// Finish moves op to a terminal state at now, with reason when not "".
func (op *Operation) Finish(state OperationState, reason string, now time.Time) {
	op.State, op.Updated = state, now
	if reason != "" {
		op.Error = reason
	}
	if op.Finished == nil {
		op.Finished = &now
	}
}

// OpFailover is recorded by dbcloud itself when it brought a
// service whose primary was lost back to READY, by a failover to a standby
// or by restarting the primary; it is never pending.
const (
	OpFailover       OperationType = "failover"
	OpRestartPrimary OperationType = "restart_primary"
)

// HistoryRetention is how long finished operations and events are kept.
const HistoryRetention = 7 * 24 * time.Hour

// OperationFilter selects operations.
type OperationFilter struct {
	ResourceID string
	// Subject, when set, selects the operations on it and on the resources
	// that belong to it (ParentID).
	Subject string
	Pending bool
	Limit   int
	// Newest orders newest first instead of oldest first.
	Newest bool
	// Before, when set, selects only operations older than this one (by
	// accepted time, then ID), for paging newest first.
	Before *Operation
}

// FinishedOperation is an operation recorded when its work is already
// over (a credential made, revoked or expired): history, never pending.
// failure is "" when it succeeded.
func FinishedOperation(projectID, parentID, resourceID string, t OperationType, by Requester, now time.Time, failure string) *Operation {
	op := &Operation{ID: NewID(), ProjectID: projectID, ParentID: parentID, ResourceID: resourceID, Type: t,
		State: OpPending, Created: now, Updated: now, RequestedBy: by, Started: &now}
	state := OpSucceeded
	if failure != "" {
		state = OpFailed
	}
	op.Finish(state, failure, now)
	return op
}
