package local

import (
	"context"

	"dbcloud"
)

// Snapshots lists the service's complete snapshots, oldest first, from
// their manifests: what a LAST_SNAPSHOT fork restores (the newest) and
// where a PITR fork can start (those with archived WAL after them).
func (rt *Runtime) Snapshots(ctx context.Context, svc *dbcloud.Service) ([]dbcloud.SnapshotInfo, error) {
	snaps, err := rt.backups.Snapshots(rt.serviceDir(svc.ID))
	if err != nil {
		return nil, err
	}
	out := make([]dbcloud.SnapshotInfo, len(snaps))
	for i, s := range snaps {
		out[i] = dbcloud.SnapshotInfo{
			Name: s.Name, Started: s.Started.UTC(), Finished: s.Finished.UTC(), Bytes: s.Bytes,
			Timeline: s.Timeline, StartLSN: s.StartLSN, StopLSN: s.StopLSN, PITRBase: s.Archived,
		}
	}
	return out, nil
}
