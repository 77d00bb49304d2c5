package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"dbcloud"
)

var _ dbcloud.Tx = (*tx)(nil)

// tx implements dbcloud.Tx. Its methods take no context because the
// interface has none; they use the context of the View or Update call.
type tx struct {
	ctx context.Context
	tx  *sql.Tx
	s   *Store
	// forUpdate ends the queries of finders: the dialect's row lock in
	// write transactions, "" in read-only ones.
	forUpdate string
	// touched holds the revision scopes (dbcloud.Revisions) this
	// transaction wrote to; their counters grow just before it commits.
	touched map[string]struct{}
	// bumped holds the counters bumpRevisions left, which the Store keeps
	// in memory once the transaction has committed.
	bumped map[string]int64
}

// touch records a write to what scope covers.
func (t *tx) touch(scope string) {
	if t.touched == nil {
		t.touched = map[string]struct{}{}
	}
	t.touched[scope] = struct{}{}
}

// bumpRevisions grows the counter of every scope the transaction touched,
// in sorted order: the counter rows are locked last and always in the same
// order, so two transactions never wait on each other's counters in a
// cycle, whatever order they wrote their other rows in.
func (t *tx) bumpRevisions() error {
	if len(t.touched) == 0 {
		return nil
	}
	scopes := make([]string, 0, len(t.touched))
	for s := range t.touched {
		scopes = append(scopes, s)
	}
	slices.Sort(scopes)
	t.bumped = make(map[string]int64, len(scopes))
	for _, s := range scopes {
		var rev int64
		err := t.tx.QueryRowContext(t.ctx, t.s.rebind(`INSERT INTO revisions (scope, rev) VALUES (?, 1)
			ON CONFLICT (scope) DO UPDATE SET rev = revisions.rev + 1 RETURNING rev`), s).Scan(&rev)
		if err != nil {
			return fmt.Errorf("count change of %s: %w", s, t.s.formatError(err))
		}
		t.bumped[s] = rev
	}
	return nil
}

// timeLayout is RFC 3339 in UTC with all nine fractional digits, so that the
// text order of the indexed time columns is their time order in every
// database (RFC3339Nano trims zeros, which breaks that).
const timeLayout = "2006-01-02T15:04:05.000000000Z"

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func (t *tx) exec(query string, args ...any) (sql.Result, error) {
	res, err := t.tx.ExecContext(t.ctx, t.s.rebind(query), args...)
	return res, t.s.formatError(err)
}

func (t *tx) query(query string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(t.ctx, t.s.rebind(query), args...)
}

// insert runs an INSERT ... ON CONFLICT DO NOTHING and reports ErrDuplicate
// when it inserted nothing. Not raising the unique violation matters on
// PostgreSQL, where an error aborts the whole transaction: the caller may
// act on ErrDuplicate (try another port, say) and go on, as on SQLite.
func (t *tx) insert(query string, args ...any) error {
	res, err := t.exec(query, args...)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return dbcloud.ErrDuplicate
	}
	return nil
}

// change runs an UPDATE or DELETE of one row and reports ErrNotFound when
// it matched none.
func (t *tx) change(query string, args ...any) error {
	res, err := t.exec(query, args...)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return dbcloud.ErrNotFound
	}
	return nil
}

// encode returns v's doc. It is a string, not []byte, because drivers bind
// []byte as a BLOB, which a STRICT SQLite TEXT column refuses.
func encode(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode %T: %w", v, err)
	}
	return string(b), nil
}

func decode[T any](doc []byte) (*T, error) {
	v := new(T)
	if err := json.Unmarshal(doc, v); err != nil {
		return nil, fmt.Errorf("decode %T: %w", v, err)
	}
	normalize(v)
	return v, nil
}

// normalize puts every time of a decoded entity in UTC. JSON keeps only a
// time's offset, not its Location, so returning UTC is the one way to give
// back the same value for every input; the domain writes UTC anyway.
func normalize(v any) {
	switch v := v.(type) {
	case *dbcloud.User:
		utc(&v.Created)
	case *dbcloud.Project:
		utc(&v.Created)
	case *dbcloud.APIKey:
		utc(&v.Created)
		utcPtr(v.Revoked)
	case *dbcloud.Service:
		utc(&v.Created)
		if v.Fork != nil {
			utcPtr(v.Fork.TargetTime)
		}
		if v.Metrics != nil {
			utc(&v.Metrics.Measured)
		}
	case *dbcloud.ReadReplicaSet:
		utc(&v.Created)
	case *dbcloud.VPC:
		utc(&v.Created)
	case *dbcloud.Peering:
		utc(&v.Created)
	case *dbcloud.Operation:
		utc(&v.Created)
		utc(&v.Updated)
		utc(&v.LeaseExpires)
		utcPtr(v.Started)
		utcPtr(v.Finished)
	case *dbcloud.Event:
		utc(&v.Time)
	case *dbcloud.IdempotencyRecord:
		utc(&v.Created)
	}
}

func utc(t *time.Time) { *t = t.UTC() }

func utcPtr(t *time.Time) {
	if t != nil {
		utc(t)
	}
}
