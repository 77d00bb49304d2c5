package dbcloud

import (
	"strings"
	"testing"
)

// allStatuses are the statuses of the API document, in its order.
var allStatuses = []ServiceStatus{StatusQueued, StatusDeleting, StatusConfiguring, StatusReady, StatusDeleted,
	StatusUnstable, StatusPausing, StatusPaused, StatusResuming, StatusUpgrading, StatusOptimizing}

// TestTransitions holds the table to decisions.md section 6, written out
// by hand: which statuses each action starts from, what it shows at once
// and where it settles. It is not derived from the table, so a changed
// row fails here until the section changes too.
func TestTransitions(t *testing.T) {
	const (
		Q = StatusQueued
		C = StatusConfiguring
		R = StatusReady
		U = StatusUnstable
		P = StatusPaused
	)
	for _, tc := range []struct {
		t        Transition
		from     string // the statuses allowed, comma-separated
		through  ServiceStatus
		to       ServiceStatus
		recorded OperationType
	}{
		{Create, "", Q, R, OpCreateService},
		{Fork, "", Q, R, OpCreateService},
		{Provision, "QUEUED", C, R, ""},
		{Start, "PAUSED", StatusResuming, R, OpStartService},
		{Stop, "READY,UNSTABLE", StatusPausing, P, OpStopService},
		{Resize, "READY,UNSTABLE", C, R, OpResizeService},
		{GrowHA, "READY", C, R, OpSetHA},
		{ShrinkHA, "READY,UNSTABLE", C, R, OpSetHA},
		{EnablePooler, "READY", C, R, OpSetPooler},
		{DisablePooler, "READY,UNSTABLE", C, R, OpSetPooler},
		{AttachVPC, "READY", C, R, OpAttachVPC},
		{DetachVPC, "READY", C, R, OpDetachVPC},
		{UpdatePassword, "READY", "", "", ""},
		{CreateCredential, "READY", "", "", ""},
		{RevokeCredential, "READY", "", "", ""},
		{Delete, "QUEUED,CONFIGURING,READY,UNSTABLE,PAUSING,PAUSED,RESUMING,UPGRADING,OPTIMIZING", StatusDeleting, StatusDeleted, OpDeleteService},
		{PrimaryLost, "READY", U, R, OpFailover},
		{Upgrade, "READY", StatusUpgrading, R, OpUpgradeService},
	} {
		name := tc.t.Action + "/" + string(tc.through)
		for _, from := range allStatuses {
			want := tc.from != "" && strings.Contains(","+tc.from+",", ","+string(from)+",")
			if got := tc.t.Allows(from); got != want {
				t.Errorf("%s from %s: allowed %v, want %v", name, from, got, want)
			}
			err := tc.t.Check(&Service{ID: "s1", Status: from})
			if (err == nil) != want {
				t.Errorf("%s from %s: Check = %v", name, from, err)
			} else if err != nil && (ErrorKindOf(err) != KindConflict || !strings.Contains(err.Error(), tc.t.Action+" needs it ")) {
				t.Errorf("%s from %s: refusal %v is not a 409 naming the action and the statuses it needs", name, from, err)
			}
		}
		if tc.t.Through != tc.through || tc.t.To != tc.to || tc.t.Op != tc.recorded {
			t.Errorf("%s: through %s, to %s, op %q; want %s, %s, %q", name, tc.t.Through, tc.t.To, tc.t.Op, tc.through, tc.to, tc.recorded)
		}
		s := &Service{Status: R}
		tc.t.Apply(s)
		if want := tc.through; want != "" && s.Status != want || want == "" && s.Status != R {
			t.Errorf("%s: Apply left %s", name, s.Status)
		}
	}
}

// TestTransitions_EveryStatusAccounted: each status of the API document is
// shown by some row, is where the engine settles a service (READY, PAUSED,
// UNSTABLE), or is named in Unshown with the work that will show it.
func TestTransitions_EveryStatusAccounted(t *testing.T) {
	shown := map[ServiceStatus]bool{StatusReady: true, StatusPaused: true, StatusUnstable: true}
	for _, tr := range ServiceTransitions {
		shown[tr.Through], shown[tr.To] = true, true
	}
	for _, s := range allStatuses {
		why, unshown := Unshown[s]
		if shown[s] == unshown {
			t.Errorf("status %s: shown by the table %v, listed as unshown %v (%q)", s, shown[s], unshown, why)
		}
	}
}
