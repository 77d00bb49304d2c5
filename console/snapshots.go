package console

import (
	"net/http"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

// Snapshots: a service's snapshots, its point-in-time recovery window and
// its last verified restore, each snapshot with a fork from it.

type snapshotsData struct {
	V    *cloud.ServiceView
	List *cloud.SnapshotList
	// Rows are the snapshots, newest first, with how to fork from each.
	Rows []snapshotRow
}

type snapshotRow struct {
	dbcloud.SnapshotInfo
	// Last is the newest snapshot (a LAST_SNAPSHOT fork restores it);
	// At is the snapshot's end as a PITR target, "" when the window does
	// not hold it.
	Last bool
	At   string
}

func (h *Handler) snapshotsGet(w http.ResponseWriter, r *http.Request, s *session) {
	pid, sid := r.PathValue("pid"), r.PathValue("sid")
	h.show(w, r, s, "snapshots", "Snapshots", h.fromQuery(r, s), func() (any, error) {
		v, err := h.cloud.GetService(r.Context(), pid, sid)
		if err != nil {
			return nil, err
		}
		l, err := h.cloud.ListSnapshots(r.Context(), pid, sid)
		if err != nil {
			return nil, err
		}
		d := snapshotsData{V: v, List: l}
		win := l.Window
		for i := len(l.Snapshots) - 1; i >= 0; i-- {
			sn := l.Snapshots[i]
			row := snapshotRow{SnapshotInfo: sn, Last: i == len(l.Snapshots)-1}
			// A PITR target is whole seconds (the form's step): the
			// second after the snapshot ended is inside it.
			at := sn.Finished.UTC().Truncate(time.Second).Add(time.Second)
			if !win.From.IsZero() && !at.Before(win.From) && !at.After(win.To) {
				row.At = at.Format("2006-01-02T15:04:05")
			}
			d.Rows = append(d.Rows, row)
		}
		return d, nil
	})
}
