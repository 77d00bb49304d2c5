package dbcloud

import "strings"

// Transition is one row of the service state machine of decisions.md
// section 6: an action a service in one of From may take, the status it
// shows at once (Through: what the 202 body already says) and the status
// the engine settles it at when the work succeeds (To). Failure is the
// same for every row: the engine shows UNSTABLE with the reason.
//
// The service layer checks and applies these rows; nothing else assigns
// a service's status except the engine's settling (READY, PAUSED or
// UNSTABLE from what it observed, engine/service.go settled).
type Transition struct {
	// Action names the request as the API document does; refusals quote it.
	Action string
	// Op is the operation recorded; "" for a check that records none.
	Op OperationType
	// From lists the statuses the action may start from; nil for a new
	// service.
	From []ServiceStatus
	// Through is the status shown as soon as the action is accepted; ""
	// leaves the status as it is.
	Through ServiceStatus
	// To is where the engine settles the service when the work is done.
	To ServiceStatus
}

// settledStatuses are the statuses from which a service takes any change.
var settledStatuses = []ServiceStatus{StatusReady, StatusUnstable}

// The rows. Delete supersedes work in flight, so it starts from anything
// but DELETING; a correction (stop, resize, shrinking HA, disabling the
// pooler) that supersedes failing work is checked against the status
// that work left (see cloud.correct).
var (
	Create        = Transition{Action: "createService", Op: OpCreateService, Through: StatusQueued, To: StatusReady}
	Fork          = Transition{Action: "forkService", Op: OpCreateService, Through: StatusQueued, To: StatusReady}
	Provision     = Transition{Action: "provisioning", From: []ServiceStatus{StatusQueued}, Through: StatusConfiguring, To: StatusReady}
	Start         = Transition{Action: "startService", Op: OpStartService, From: []ServiceStatus{StatusPaused}, Through: StatusResuming, To: StatusReady}
	Stop          = Transition{Action: "stopService", Op: OpStopService, From: settledStatuses, Through: StatusPausing, To: StatusPaused}
	Resize        = Transition{Action: "resize", Op: OpResizeService, From: settledStatuses, Through: StatusConfiguring, To: StatusReady}
	GrowHA        = Transition{Action: "setHA", Op: OpSetHA, From: []ServiceStatus{StatusReady}, Through: StatusConfiguring, To: StatusReady}
	ShrinkHA      = Transition{Action: "setHA", Op: OpSetHA, From: settledStatuses, Through: StatusConfiguring, To: StatusReady}
	EnablePooler  = Transition{Action: "enablePooler", Op: OpSetPooler, From: []ServiceStatus{StatusReady}, Through: StatusConfiguring, To: StatusReady}
	DisablePooler = Transition{Action: "disablePooler", Op: OpSetPooler, From: settledStatuses, Through: StatusConfiguring, To: StatusReady}
	AttachVPC     = Transition{Action: "attachToVPC", Op: OpAttachVPC, From: []ServiceStatus{StatusReady}, Through: StatusConfiguring, To: StatusReady}
	DetachVPC     = Transition{Action: "detachFromVPC", Op: OpDetachVPC, From: []ServiceStatus{StatusReady}, Through: StatusConfiguring, To: StatusReady}
	// UpdatePassword changes no status: it needs READY and takes effect
	// before its 204 (decisions.md section 6).
	UpdatePassword = Transition{Action: "updatePassword", From: []ServiceStatus{StatusReady}}
	// CreateCredential, like UpdatePassword, works on the running
	// database before it answers (decisions.md section 12).
	CreateCredential = Transition{Action: "createCredential", From: []ServiceStatus{StatusReady}}
	// RevokeCredential drops the role at once on a READY service; on any
	// other the revocation is recorded and the engine drops the role
	// before the service serves again.
	RevokeCredential = Transition{Action: "revokeCredential", From: []ServiceStatus{StatusReady}}
	Delete           = Transition{Action: "deleteService", Op: OpDeleteService,
		From: []ServiceStatus{StatusQueued, StatusConfiguring, StatusReady, StatusUnstable, StatusPausing, StatusPaused,
			StatusResuming, StatusUpgrading, StatusOptimizing},
		Through: StatusDeleting, To: StatusDeleted}
	// SetAutoPause changes no status; it takes effect at once.
	SetAutoPause = Transition{Action: "setAutoPause", From: []ServiceStatus{StatusReady, StatusUnstable, StatusPaused}}
	// AutoPauseIdle and Wake are dbcloud's own (decisions.md section 10):
	// an idle service pauses as a stop does, and a connection to an
	// auto-paused one resumes it as a start does.
	AutoPauseIdle = Transition{Action: "auto-pause", Op: OpAutoPause, From: []ServiceStatus{StatusReady}, Through: StatusPausing, To: StatusPaused}
	Wake          = Transition{Action: "wake", Op: OpWake, From: []ServiceStatus{StatusPaused}, Through: StatusResuming, To: StatusReady}
	// Upgrade moves a READY service to a newer PostgreSQL major version
	// (decisions.md section 11); it is READY again on the new version, or
	// on its old one with the reason when the upgrade failed.
	Upgrade = Transition{Action: "upgradeService", Op: OpUpgradeService, From: []ServiceStatus{StatusReady}, Through: StatusUpgrading, To: StatusReady}
	// PrimaryLost is the engine's: a READY service whose primary stopped
	// answering shows UNSTABLE until a restart or a failover brings it back.
	PrimaryLost = Transition{Action: "primary lost", Op: OpFailover, From: []ServiceStatus{StatusReady}, Through: StatusUnstable, To: StatusReady}
)

// ServiceTransitions is the whole table, in the order of decisions.md.
var ServiceTransitions = []Transition{Create, Fork, Provision, Start, Stop, Resize, GrowHA, ShrinkHA,
	EnablePooler, DisablePooler, AttachVPC, DetachVPC, UpdatePassword, CreateCredential, RevokeCredential, Delete, SetAutoPause, AutoPauseIdle, Wake, PrimaryLost, Upgrade}

// Unshown are the statuses the API document lists that dbcloud never
// shows yet, with the work that will.
var Unshown = map[ServiceStatus]string{
	StatusOptimizing: "reserved for storage work (decisions.md section 6); no issue yet",
}

// Allows reports whether a service in status from may take the action.
func (t Transition) Allows(from ServiceStatus) bool {
	for _, s := range t.From {
		if s == from {
			return true
		}
	}
	return false
}

// Check refuses the action for s when its status does not allow it: a
// 409 the caller can act on by waiting for the status it names.
func (t Transition) Check(s *Service) error {
	if t.Allows(s.Status) {
		return nil
	}
	from := make([]string, len(t.From))
	for i, f := range t.From {
		from[i] = string(f)
	}
	return Errorf(KindConflict, "Service %s is %s; %s needs it %s.", s.ID, s.Status, t.Action, strings.Join(from, " or "))
}

// Apply shows s in the action's Through status.
func (t Transition) Apply(s *Service) {
	if t.Through != "" {
		s.Status = t.Through
	}
}
