package cloud

import (
	"context"
	"strings"
	"testing"
	"time"

	"dbcloud"
)

// backupsRuntime is a Runtime that also reports a fixed recovery window.
type backupsRuntime struct {
	dbcloud.Runtime
	w dbcloud.RecoveryWindow
}

func (r backupsRuntime) RecoveryWindow(context.Context, *dbcloud.Service) (dbcloud.RecoveryWindow, error) {
	return r.w, nil
}

func TestCloud_CheckForkSource(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	parent := &dbcloud.Service{ID: "parent0001", Created: now.Add(-48 * time.Hour)}
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	from, last := now.Add(-24*time.Hour), now.Add(-time.Hour)
	for _, c := range []struct {
		name     string
		w        dbcloud.RecoveryWindow
		strategy dbcloud.ForkStrategy
		target   *time.Time
		kind     dbcloud.ErrorKind // KindInternal: no error
		says     string
	}{
		{"NowNeedsNoSnapshot", dbcloud.RecoveryWindow{}, dbcloud.ForkNow, nil, dbcloud.KindInternal, ""},
		{"LastSnapshot", dbcloud.RecoveryWindow{LastSnapshot: last}, dbcloud.ForkLastSnapshot, nil, dbcloud.KindInternal, ""},
		{"LastSnapshotNone", dbcloud.RecoveryWindow{}, dbcloud.ForkLastSnapshot, nil, dbcloud.KindConflict, "no snapshot yet"},
		{"PITRNoArchivedSnapshot", dbcloud.RecoveryWindow{LastSnapshot: last}, dbcloud.ForkPITR, at(-time.Minute), dbcloud.KindConflict, "no snapshot with archived WAL"},
		{"PITRInside", dbcloud.RecoveryWindow{LastSnapshot: last, From: from, To: now}, dbcloud.ForkPITR, at(-time.Minute), dbcloud.KindInternal, ""},
		{"PITRAtEdges", dbcloud.RecoveryWindow{LastSnapshot: last, From: from, To: now}, dbcloud.ForkPITR, &from, dbcloud.KindInternal, ""},
		{"PITRBefore", dbcloud.RecoveryWindow{LastSnapshot: last, From: from, To: now}, dbcloud.ForkPITR, at(-25 * time.Hour), dbcloud.KindInvalid,
			"outside the recovery window 2026-02-28T12:00:00Z to 2026-03-01T12:00:00Z."},
		{"PITRAfterStopped", dbcloud.RecoveryWindow{LastSnapshot: last, From: from, To: last, Stopped: true}, dbcloud.ForkPITR, at(-time.Minute), dbcloud.KindInvalid,
			"its window ends at its last archived transaction"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cloud := &Cloud{Runtime: backupsRuntime{w: c.w}, Now: func() time.Time { return now }}
			err := cloud.checkForkSource(context.Background(), parent, c.strategy, c.target)
			if c.kind == dbcloud.KindInternal {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if dbcloud.ErrorKindOf(err) != c.kind || !strings.Contains(err.Error(), c.says) {
				t.Errorf("got %v, want kind %d saying %q", err, c.kind, c.says)
			}
		})
	}
	t.Run("RuntimeWithoutBackups", func(t *testing.T) {
		cloud := &Cloud{Runtime: nil, Now: func() time.Time { return now }}
		if err := cloud.checkForkSource(context.Background(), parent, dbcloud.ForkPITR, at(-time.Hour)); err != nil {
			t.Errorf("inside [created, now]: %v", err)
		}
		if err := cloud.checkForkSource(context.Background(), parent, dbcloud.ForkPITR, at(-72*time.Hour)); dbcloud.ErrorKindOf(err) != dbcloud.KindInvalid {
			t.Errorf("before creation: %v", err)
		}
	})
}
