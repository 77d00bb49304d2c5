package dbcloud

import (
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

// ResourceKindOf is the kind of resource an operation of type t acts on:
// service, replica_set or peering.
func ResourceKindOf(t OperationType) string { return t.ResourceKind() }

func (t OperationType) ResourceKind() string {
	switch t {
	case OpCreateReplicaSet, OpDeleteReplicaSet, OpResizeReplicaSet, OpSetReplicaPooler:
		return "replica_set"
	case OpCreatePeering, OpDeletePeering:
		return "peering"
	case OpCreateCredential, OpRevokeCredential, OpExpireCredential:
		return "credential"
	case OpCreateService, OpDeleteService, OpStartService, OpStopService, OpResizeService, OpSetHA,
		OpSetPooler, OpAttachVPC, OpDetachVPC, OpFailover, OpRestartPrimary, OpAutoPause, OpWake:
		return "service"
	}
	return "service"
}
