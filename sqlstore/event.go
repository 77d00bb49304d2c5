package sqlstore

import (
	"fmt"
	"time"

	"dbcloud"
)

// events are listed as entities; inserting one takes its ID from a
// counter, so InsertEvent is written out.
var events = define(entity[dbcloud.Event]{
	table: "events", noun: "event",
	key:    []string{"project_id", "id"},
	values: func(e *dbcloud.Event) []any { return []any{e.ProjectID, e.ID} },
})

// InsertEvent takes the project's next event ID from its counter row and
// records the event. The counter's row lock is held to commit, so a
// concurrent writer of the same project gets the next ID only after this
// transaction ends: IDs appear to readers in increasing order, and a reader
// resuming after ID N never misses an ID below N that commits later.
func (t *tx) InsertEvent(e *dbcloud.Event) error {
	rows, err := t.query(`INSERT INTO event_counters (project_id, last_id) VALUES (?, 1)
		ON CONFLICT (project_id) DO UPDATE SET last_id = event_counters.last_id + 1
		RETURNING last_id`, e.ProjectID)
	if err != nil {
		return fmt.Errorf("next event ID of project %s: %w", e.ProjectID, t.s.formatError(err))
	}
	var id int64
	if rows.Next() {
		err = rows.Scan(&id)
	}
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return fmt.Errorf("next event ID of project %s: %w", e.ProjectID, err)
	}
	if id == 0 {
		return fmt.Errorf("next event ID of project %s: the counter returned no row", e.ProjectID)
	}
	e.ID = id
	doc, err := encode(e)
	if err != nil {
		return err
	}
	if _, err := t.exec(`INSERT INTO events (project_id, id, created, doc) VALUES (?, ?, ?, ?)`,
		e.ProjectID, e.ID, formatTime(e.Time), doc); err != nil {
		return fmt.Errorf("insert event %d of project %s: %w", e.ID, e.ProjectID, err)
	}
	return nil
}

// ListEvents returns up to limit events of the project after ID after,
// oldest first.
func (t *tx) ListEvents(projectID string, after int64, limit int) ([]*dbcloud.Event, error) {
	return events.list(t, "events of project "+projectID, `WHERE project_id = ? AND id > ? ORDER BY id LIMIT ?`,
		projectID, after, limit)
}

// DeleteEventsBefore deletes the events recorded before before. The
// counters stay, so IDs are never reused.
func (t *tx) DeleteEventsBefore(before time.Time) (int, error) {
	return t.deleteBefore("events", `DELETE FROM events WHERE created < ?`, before)
}

// DeleteOperationsBefore deletes the terminal operations accepted before
// before; pending ones stay whatever their age.
func (t *tx) DeleteOperationsBefore(before time.Time) (int, error) {
	return t.deleteBefore("operations", `DELETE FROM operations WHERE created < ? AND state <> 'pending'`, before)
}

func (t *tx) deleteBefore(what, query string, before time.Time) (int, error) {
	res, err := t.exec(query, formatTime(before))
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil {
			return int(n), nil
		}
	}
	return 0, fmt.Errorf("delete %s before %s: %w", what, before.UTC().Format(time.RFC3339), err)
}
