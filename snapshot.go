package dbcloud

import (
	"time"
)

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

// SnapshotInfo describes one snapshot of a service: what a LAST_SNAPSHOT
// fork restores, and where a PITR fork can start.
type SnapshotInfo struct {
	Name     string    `json:"name"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Bytes    int64     `json:"bytes"`
	Timeline uint32    `json:"timeline"`
	StartLSN string    `json:"start_lsn"`
	StopLSN  string    `json:"stop_lsn"`
	// PITRBase says WAL is archived from this snapshot on, so point-in-time
	// forks can start from it.
	PITRBase bool `json:"pitr_base"`
}
