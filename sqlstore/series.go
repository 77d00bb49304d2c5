package sqlstore

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"dbcloud"
)

var _ dbcloud.SeriesStore = (*Store)(nil)

// seriesKey orders rows as the primary key does, so concurrent batches on
// PostgreSQL lock rows in one order and cannot deadlock.
func seriesKey(a, b dbcloud.SeriesRow) int {
	return cmp.Or(cmp.Compare(a.ServiceID, b.ServiceID), cmp.Compare(a.Resolution, b.Resolution),
		a.Bucket.Compare(b.Bucket), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Labels, b.Labels))
}

// seriesChunk is how many rows one INSERT carries: 11 parameters each,
// well below SQLite's and PostgreSQL's limits, and few round trips.
const seriesChunk = 200

// AddSeriesRows merges rows in one transaction. Rows of one key are merged
// here first (a batch may hold several samples of one minute), because one
// INSERT ... ON CONFLICT may not touch a row twice; then each chunk is one
// multi-row statement, the merge with stored rows done by the database.
func (s *Store) AddSeriesRows(ctx context.Context, rows []dbcloud.SeriesRow) error {
	if len(rows) == 0 {
		return nil
	}
	rows = mergeSeriesRows(rows)
	tx, err := s.db.BeginTx(ctx, &s.dialect.UpdateTx)
	if err != nil {
		return fmt.Errorf("begin %s transaction: %w", s.dialect.Name, err)
	}
	defer func() { _ = tx.Rollback() }()
	for len(rows) > 0 {
		chunk := rows[:min(len(rows), seriesChunk)]
		rows = rows[len(chunk):]
		var b strings.Builder
		b.WriteString(`INSERT INTO metric_series (service_id, name, labels, resolution, bucket, count, sum, first, min, max, last) VALUES `)
		args := make([]any, 0, len(chunk)*11)
		for i, r := range chunk {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
			args = append(args, r.ServiceID, r.Name, r.Labels, int64(r.Resolution/time.Second), r.Bucket.Unix(),
				r.Count, r.Sum, r.First, r.Min, r.Max, r.Last)
		}
		b.WriteString(` ON CONFLICT (service_id, resolution, bucket, name, labels) DO UPDATE SET
			count = metric_series.count + excluded.count,
			sum = metric_series.sum + excluded.sum,
			min = CASE WHEN excluded.min < metric_series.min THEN excluded.min ELSE metric_series.min END,
			max = CASE WHEN excluded.max > metric_series.max THEN excluded.max ELSE metric_series.max END,
			last = excluded.last`)
		if _, err := tx.ExecContext(ctx, s.rebind(b.String()), args...); err != nil {
			return fmt.Errorf("add series rows: %w", err)
		}
	}
	if err := s.commit(tx, true, nil); err != nil {
		return fmt.Errorf("commit series rows: %w", err)
	}
	return nil
}

// mergeSeriesRows sorts rows by key (stably: rows of one key stay in the
// caller's time order, which makes first and last right) and merges the
// rows of each key into one.
func mergeSeriesRows(in []dbcloud.SeriesRow) []dbcloud.SeriesRow {
	rows := slices.Clone(in)
	slices.SortStableFunc(rows, seriesKey)
	out := rows[:0]
	for _, r := range rows {
		if n := len(out); n > 0 && seriesKey(out[n-1], r) == 0 {
			m := &out[n-1]
			m.Count += r.Count
			m.Sum += r.Sum
			m.Min = math.Min(m.Min, r.Min)
			m.Max = math.Max(m.Max, r.Max)
			m.Last = r.Last
			continue
		}
		out = append(out, r)
	}
	return out
}

// ListSeriesRows returns a service's rows of one series and resolution in
// [from, to), ordered by labels, then bucket.
func (s *Store) ListSeriesRows(ctx context.Context, serviceID, name string, res time.Duration, from, to time.Time) ([]dbcloud.SeriesRow, error) {
	rows, err := s.readDB.QueryContext(ctx, s.rebind(`SELECT labels, bucket, count, sum, first, min, max, last FROM metric_series
		WHERE service_id = ? AND name = ? AND resolution = ? AND bucket >= ? AND bucket < ?
		ORDER BY labels, bucket`), serviceID, name, int64(res/time.Second), from.Unix(), ceilUnix(to))
	if err != nil {
		return nil, fmt.Errorf("list series %s of %s: %w", name, serviceID, err)
	}
	defer rows.Close()
	var out []dbcloud.SeriesRow
	for rows.Next() {
		r := dbcloud.SeriesRow{ServiceID: serviceID, Name: name, Resolution: res}
		var bucket int64
		if err := rows.Scan(&r.Labels, &bucket, &r.Count, &r.Sum, &r.First, &r.Min, &r.Max, &r.Last); err != nil {
			return nil, fmt.Errorf("list series %s of %s: %w", name, serviceID, err)
		}
		r.Bucket = time.Unix(bucket, 0).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list series %s of %s: %w", name, serviceID, err)
	}
	return out, nil
}

// ceilUnix is t in Unix seconds, rounded up: buckets are whole seconds, and
// one starting within t's second is before t only if t has a fraction.
func ceilUnix(t time.Time) int64 {
	u := t.Unix()
	if t.Nanosecond() > 0 {
		u++
	}
	return u
}

// seriesServices lists the services that have rows, reading one key per
// service (a loose index scan: each step seeks the next service_id), not
// every row.
const seriesServices = `WITH RECURSIVE s(id) AS (
	SELECT MIN(service_id) FROM metric_series
	UNION ALL
	SELECT (SELECT MIN(service_id) FROM metric_series WHERE service_id > s.id) FROM s WHERE s.id IS NOT NULL
) SELECT id FROM s WHERE id IS NOT NULL`

// DeleteSeriesRowsBefore deletes one resolution's rows older than before:
// per service, one range of the primary key, so the work is the rows
// deleted, not the table.
func (s *Store) DeleteSeriesRowsBefore(ctx context.Context, res time.Duration, before time.Time) (int, error) {
	fail := func(err error) error {
		return fmt.Errorf("delete series rows before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	rows, err := s.db.QueryContext(ctx, seriesServices)
	if err != nil {
		return 0, fail(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, fail(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fail(err)
	}
	total := 0
	q := s.rebind(`DELETE FROM metric_series WHERE service_id = ? AND resolution = ? AND bucket < ?`)
	for _, id := range ids {
		r, err := s.db.ExecContext(ctx, q, id, int64(res/time.Second), before.Unix())
		if err != nil {
			return total, fail(err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return total, fail(err)
		}
		total += int(n)
	}
	return total, nil
}

// DeleteSeries deletes a service's rows (a prefix of the primary key).
func (s *Store) DeleteSeries(ctx context.Context, serviceID string) (int, error) {
	r, err := s.db.ExecContext(ctx, s.rebind(`DELETE FROM metric_series WHERE service_id = ?`), serviceID)
	if err != nil {
		return 0, fmt.Errorf("delete series of %s: %w", serviceID, err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("delete series of %s: %w", serviceID, err)
	}
	return int(n), nil
}

// CountSeriesRows returns how many series rows are stored.
func (s *Store) CountSeriesRows(ctx context.Context) (int, error) {
	var n int
	if err := s.readDB.QueryRowContext(ctx, `SELECT COUNT(*) FROM metric_series`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count series rows: %w", err)
	}
	return n, nil
}
