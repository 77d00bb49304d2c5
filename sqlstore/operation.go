package sqlstore

import (
	"fmt"
	"strings"
	"time"

	"dbcloud"
)

var operations = define(entity[dbcloud.Operation]{
	table: "operations", noun: "operation",
	key:  []string{"id"},
	cols: []string{"project_id", "resource_id", "parent_id", "state", "created"},
	set:  []string{"project_id", "resource_id", "parent_id", "state", "created"},
	values: func(op *dbcloud.Operation) []any {
		return []any{op.ID, op.ProjectID, op.ResourceID, op.ParentID, string(op.State), formatTime(op.Created)}
	},
})

// InsertOperation adds an operation; ErrDuplicate if the ID exists.
func (t *tx) InsertOperation(op *dbcloud.Operation) error { return operations.insert(t, op) }

// FindOperation returns an operation by ID.
func (t *tx) FindOperation(id string) (*dbcloud.Operation, error) { return operations.find(t, id) }

// ListOperations returns the operations f selects, oldest first (newest
// first if f.Newest): those of f.ResourceID if set, those on f.Subject or
// on resources belonging to it if set, only those accepted before f.Before
// if set, only pending ones if f.Pending, at most f.Limit if positive.
func (t *tx) ListOperations(f dbcloud.OperationFilter) ([]*dbcloud.Operation, error) {
	var (
		q    strings.Builder
		args []any
		and  = " WHERE "
	)
	if f.ResourceID != "" {
		q.WriteString(and + `resource_id = ?`)
		args = append(args, f.ResourceID)
		and = " AND "
	}
	if f.Subject != "" {
		q.WriteString(and + `(resource_id = ? OR parent_id = ?)`)
		args = append(args, f.Subject, f.Subject)
		and = " AND "
	}
	if b := f.Before; b != nil {
		c := formatTime(b.Created)
		q.WriteString(and + `(created < ? OR (created = ? AND id < ?))`)
		args = append(args, c, c, b.ID)
		and = " AND "
	}
	if f.Pending {
		// A literal, not a parameter, so that the planner can use the
		// partial index on pending operations.
		q.WriteString(and + `state = 'pending'`)
	}
	if f.Newest {
		q.WriteString(` ORDER BY created DESC, id DESC`)
	} else {
		q.WriteString(` ORDER BY created, id`)
	}
	if f.Limit > 0 {
		q.WriteString(` LIMIT ?`)
		args = append(args, f.Limit)
	}
	return operations.list(t, "operations", q.String(), args...)
}

// UpdateOperation replaces an operation; ErrNotFound if it is missing.
func (t *tx) UpdateOperation(op *dbcloud.Operation) error { return operations.update(t, op) }

// ListPorts returns the claimed endpoint ports and their owners.
func (t *tx) ListPorts() (map[int]string, error) {
	rows, err := t.query(`SELECT port, owner FROM ports`)
	if err != nil {
		return nil, fmt.Errorf("list ports: %w", err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var (
			port  int
			owner string
		)
		if err := rows.Scan(&port, &owner); err != nil {
			return nil, fmt.Errorf("list ports: %w", err)
		}
		out[port] = owner
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list ports: %w", err)
	}
	return out, nil
}

// ClaimPort records that owner holds port; ErrDuplicate if anyone holds it.
// Two transactions claiming one port cannot both succeed: the port is the
// primary key, and on PostgreSQL the second waits for the first to end.
func (t *tx) ClaimPort(port int, owner string) error {
	if err := t.insert(`INSERT INTO ports (port, owner) VALUES (?, ?) ON CONFLICT DO NOTHING`, port, owner); err != nil {
		return fmt.Errorf("claim port %d for %s: %w", port, owner, err)
	}
	return nil
}

// ReleasePorts frees every port owner holds; none is not an error.
func (t *tx) ReleasePorts(owner string) error {
	if _, err := t.exec(`DELETE FROM ports WHERE owner = ?`, owner); err != nil {
		return fmt.Errorf("release ports of %s: %w", owner, err)
	}
	return nil
}

var idempotency = define(entity[dbcloud.IdempotencyRecord]{
	table: "idempotency", noun: "idempotency key",
	key:  []string{"credential", "idempotency_key"},
	cols: []string{"created"}, set: []string{"created"},
	values: func(r *dbcloud.IdempotencyRecord) []any {
		return []any{r.Credential, r.Key, formatTime(r.Created)}
	},
	label: func(key ...any) string { return fmt.Sprintf("%q", key[1]) },
})

// InsertIdempotency claims an idempotency key; ErrDuplicate if the caller
// has used the key before.
func (t *tx) InsertIdempotency(r *dbcloud.IdempotencyRecord) error { return idempotency.insert(t, r) }

// FindIdempotency returns the record of a caller's key.
func (t *tx) FindIdempotency(credential, key string) (*dbcloud.IdempotencyRecord, error) {
	return idempotency.find(t, credential, key)
}

// UpdateIdempotency replaces a record; ErrNotFound if it is missing.
func (t *tx) UpdateIdempotency(r *dbcloud.IdempotencyRecord) error { return idempotency.update(t, r) }

// DeleteIdempotencyBefore deletes the records created before before and
// returns how many it deleted.
func (t *tx) DeleteIdempotencyBefore(before time.Time) (int, error) {
	res, err := t.exec(`DELETE FROM idempotency WHERE created < ?`, formatTime(before))
	if err != nil {
		return 0, fmt.Errorf("delete idempotency keys before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("delete idempotency keys before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	return int(n), nil
}

// AcquireLease takes or renews a lease in one statement, so two processes
// racing for one resource cannot both win: the row's primary key orders them
// and the loser's conditional update touches nothing.
func (t *tx) AcquireLease(resourceID, owner string, now, expires time.Time) (bool, error) {
	res, err := t.exec(`INSERT INTO leases (resource_id, owner, expires) VALUES (?, ?, ?)
		ON CONFLICT (resource_id) DO UPDATE SET owner = excluded.owner, expires = excluded.expires
		WHERE leases.owner = excluded.owner OR leases.expires < ?`,
		resourceID, owner, formatTime(expires), formatTime(now))
	if err != nil {
		return false, fmt.Errorf("acquire lease on %s: %w", resourceID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("acquire lease on %s: %w", resourceID, err)
	}
	return n == 1, nil
}

// ReleaseLease ends owner's lease; another owner's lease is left alone.
func (t *tx) ReleaseLease(resourceID, owner string) error {
	if _, err := t.exec(`DELETE FROM leases WHERE resource_id = ? AND owner = ?`, resourceID, owner); err != nil {
		return fmt.Errorf("release lease on %s: %w", resourceID, err)
	}
	return nil
}
