package dbcloud

import "time"

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
	ID           string         `json:"id"`
	ProjectID    string         `json:"project_id"`
	ResourceID   string         `json:"resource_id"`
	Type         OperationType  `json:"type"`
	Generation   int64          `json:"generation"`
	State        OperationState `json:"state"`
	Error        string         `json:"error,omitempty"`
	Attempts     int            `json:"attempts"`
	Created      time.Time      `json:"created"`
	Updated      time.Time      `json:"updated"`
	LeaseOwner   string         `json:"lease_owner,omitempty"`
	LeaseExpires time.Time      `json:"lease_expires"`
}

// OperationFilter selects operations.
type OperationFilter struct {
	ResourceID string
	Pending    bool
	Limit      int
}
