package dbcloud

import (
	"context"
	"fmt"
	"time"
)

// Backups is implemented by runtimes that keep snapshots (base backups) and
// a continuous WAL archive per service, which is what forks restore from.
// The domain asks it while answering a fork request, so it must be cheap:
// it reads what the runtime already has and never takes a snapshot.
type Backups interface {
	// RecoveryWindow reports what a fork of the service can restore.
	RecoveryWindow(ctx context.Context, svc *Service) (RecoveryWindow, error)
}

// RestoreCheck is the result of one verified restore: the service's
// newest snapshot and its archived WAL restored into a scratch instance,
// started, checked for corruption, and removed.
type RestoreCheck struct {
	// Snapshot names the snapshot restored.
	Snapshot string    `json:"snapshot"`
	Started  time.Time `json:"started"`
	// Duration is how long the restore took, from the copy to a checked,
	// running instance: what a LAST_SNAPSHOT fork or a recovery would take.
	Duration time.Duration `json:"duration_ns"`
	// OK says the restored instance started, reached ExpectedLSN and its
	// databases passed pg_amcheck; Error says what failed otherwise.
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// RestoredLSN is where recovery ended; ExpectedLSN the newest point
	// the archive held when the check began (the last archived
	// transaction, or the snapshot's end).
	RestoredLSN string `json:"restored_lsn,omitempty"`
	ExpectedLSN string `json:"expected_lsn,omitempty"`
}

// RecoveryWindow is what a fork of one service can restore: the newest
// snapshot (LAST_SNAPSHOT) and the span of times a point-in-time fork can
// target (PITR).
type RecoveryWindow struct {
	// LastSnapshot is when the newest snapshot finished; zero when the
	// service has none yet (the first is taken once it is READY).
	LastSnapshot time.Time
	// From and To bound the PITR targets, both inclusive. From is when the
	// oldest snapshot with archived WAL after it finished; zero when there
	// is none, so no PITR is possible yet.
	From, To time.Time
	// Stopped says the service is not running, so To is the time of its
	// last archived transaction rather than now: nothing happened later.
	Stopped bool
}

// BackupMaintainer is implemented by provisioners that take snapshots on a
// schedule and prune old snapshots and WAL. The engine calls it for each
// READY service, often; it does nothing when nothing is due.
type BackupMaintainer interface {
	MaintainBackups(ctx context.Context, svc *Service) error
}

// checkForkSource refuses a fork the parent's snapshots and archive cannot
// serve: LAST_SNAPSHOT and PITR need a snapshot, and a PITR target must lie
// in the recovery window. Runtimes without backups are taken to cover
// everything since the parent was created.
func (c *Cloud) checkForkSource(ctx context.Context, parent *Service, strategy ForkStrategy, target *time.Time) error {
	if strategy == ForkNow {
		return nil // the fork takes its own snapshot of the running parent
	}
	w, err := c.recoveryWindow(ctx, parent)
	if err != nil {
		return err
	}
	if w.LastSnapshot.IsZero() {
		return Errorf(KindConflict, "Service %s has no snapshot yet; its first is taken shortly after it becomes READY. Retry in a minute, or fork it with NOW.", parent.ID)
	}
	if strategy != ForkPITR {
		return nil
	}
	if w.From.IsZero() {
		return Errorf(KindConflict, "Service %s has no snapshot with archived WAL yet, so no point in time can be restored. Retry once its next snapshot is taken, or fork it with LAST_SNAPSHOT or NOW.", parent.ID)
	}
	if target.Before(w.From) || target.After(w.To) {
		note := ""
		if w.Stopped {
			note = fmt.Sprintf(" Service %s is not running: its window ends at its last archived transaction.", parent.ID)
		}
		return Errorf(KindInvalid, "target_time %s is outside the recovery window %s to %s.%s",
			target.UTC().Format(time.RFC3339Nano), w.From.UTC().Format(time.RFC3339Nano), w.To.UTC().Format(time.RFC3339Nano), note)
	}
	return nil
}

// recoveryWindow is what a fork of the service can restore now.
func (c *Cloud) recoveryWindow(ctx context.Context, svc *Service) (RecoveryWindow, error) {
	if b, ok := c.Runtime.(Backups); ok {
		return b.RecoveryWindow(ctx, svc)
	}
	return RecoveryWindow{LastSnapshot: svc.Created, From: svc.Created, To: c.now()}, nil
}

// ForkWindow tells the caller what a fork of the service can restore (the
// console's PITR time picker).
func (c *Cloud) ForkWindow(ctx context.Context, projectID, id string) (RecoveryWindow, error) {
	v, err := c.GetService(ctx, projectID, id)
	if err != nil {
		return RecoveryWindow{}, err
	}
	return c.recoveryWindow(ctx, v.Service)
}
