package dbcloud

import "fmt"

// Storage limits. Every service may keep up to StorageLimit(size) on disk,
// data, WAL archive and snapshots together; where the runtime's filesystem
// enforces quotas (btrfs) that is a hard limit. Before it, two thresholds:
// at StorageWarnPercent the service gets a notice, at
// StorageReadOnlyPercent writes that add data are refused (deletes still
// run) until usage falls below StorageWritablePercent again. The gap
// between the last two keeps a service at the edge from flipping with
// every autovacuum.
const (
	StorageWarnPercent     = 90
	StorageReadOnlyPercent = 95
	StorageWritablePercent = 93
)

// StorageLevel is where a service stands against its storage limit.
type StorageLevel int

const (
	StorageNormal   StorageLevel = iota
	StorageWarning               // at or above StorageWarnPercent
	StorageReadOnly              // writes that add data are refused
)

// StorageLevelOf decides the level of a service that uses used of limit
// bytes, given whether it is read-only now.
func StorageLevelOf(used, limit int64, readOnly bool) StorageLevel {
	if limit <= 0 {
		return StorageNormal
	}
	pct := used * 100 / limit
	switch {
	case pct >= StorageReadOnlyPercent, readOnly && pct >= StorageWritablePercent:
		return StorageReadOnly
	case pct >= StorageWarnPercent:
		return StorageWarning
	}
	return StorageNormal
}

// StorageNotice is what the service's status_reason says at a level; ""
// at StorageNormal.
func StorageNotice(level StorageLevel, used, limit int64) string {
	gib := func(b int64) string {
		if b < 1<<30 {
			return fmt.Sprintf("%d MiB", b>>20)
		}
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	}
	switch level {
	case StorageWarning:
		return fmt.Sprintf("The service uses %s of its %s storage limit (%d%%); at %d%% writes that add data are refused.",
			gib(used), gib(limit), used*100/limit, StorageReadOnlyPercent)
	case StorageReadOnly:
		return fmt.Sprintf("The service uses %s of its %s storage limit (%d%%): writes that add data are refused until it is below %d%%. Delete data (DELETE, TRUNCATE or DROP, then VACUUM), or resize the service for a larger limit.",
			gib(used), gib(limit), used*100/limit, StorageWritablePercent)
	}
	return ""
}
