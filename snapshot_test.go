package dbcloud

import (
	"context"
	"strings"
	"testing"
	"time"
)

// backupsRuntime is a Runtime that also reports a fixed recovery window.
type backupsRuntime struct {
	Runtime
	w RecoveryWindow
}

func (r backupsRuntime) RecoveryWindow(context.Context, *Service) (RecoveryWindow, error) {
	return r.w, nil
}

func TestCloud_CheckForkSource(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	parent := &Service{ID: "parent0001", Created: now.Add(-48 * time.Hour)}
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	from, last := now.Add(-24*time.Hour), now.Add(-time.Hour)
	for _, c := range []struct {
		name     string
		w        RecoveryWindow
		strategy ForkStrategy
		target   *time.Time
		kind     ErrorKind // KindInternal: no error
		says     string
	}{
		{"NowNeedsNoSnapshot", RecoveryWindow{}, ForkNow, nil, KindInternal, ""},
		{"LastSnapshot", RecoveryWindow{LastSnapshot: last}, ForkLastSnapshot, nil, KindInternal, ""},
		{"LastSnapshotNone", RecoveryWindow{}, ForkLastSnapshot, nil, KindConflict, "no snapshot yet"},
		{"PITRNoArchivedSnapshot", RecoveryWindow{LastSnapshot: last}, ForkPITR, at(-time.Minute), KindConflict, "no snapshot with archived WAL"},
		{"PITRInside", RecoveryWindow{LastSnapshot: last, From: from, To: now}, ForkPITR, at(-time.Minute), KindInternal, ""},
		{"PITRAtEdges", RecoveryWindow{LastSnapshot: last, From: from, To: now}, ForkPITR, &from, KindInternal, ""},
		{"PITRBefore", RecoveryWindow{LastSnapshot: last, From: from, To: now}, ForkPITR, at(-25 * time.Hour), KindInvalid,
			"outside the recovery window 2026-02-28T12:00:00Z to 2026-03-01T12:00:00Z."},
		{"PITRAfterStopped", RecoveryWindow{LastSnapshot: last, From: from, To: last, Stopped: true}, ForkPITR, at(-time.Minute), KindInvalid,
			"its window ends at its last archived transaction"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cloud := &Cloud{Runtime: backupsRuntime{w: c.w}, Now: func() time.Time { return now }}
			err := cloud.checkForkSource(context.Background(), parent, c.strategy, c.target)
			if c.kind == KindInternal {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if ErrorKindOf(err) != c.kind || !strings.Contains(err.Error(), c.says) {
				t.Errorf("got %v, want kind %d saying %q", err, c.kind, c.says)
			}
		})
	}
	t.Run("RuntimeWithoutBackups", func(t *testing.T) {
		cloud := &Cloud{Runtime: nil, Now: func() time.Time { return now }}
		if err := cloud.checkForkSource(context.Background(), parent, ForkPITR, at(-time.Hour)); err != nil {
			t.Errorf("inside [created, now]: %v", err)
		}
		if err := cloud.checkForkSource(context.Background(), parent, ForkPITR, at(-72*time.Hour)); ErrorKindOf(err) != KindInvalid {
			t.Errorf("before creation: %v", err)
		}
	})
}
