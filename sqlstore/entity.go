package sqlstore

import (
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"dbcloud"
)

// entity says how one type is stored: its table, the columns that identify
// a row, the indexed copies of its fields, and how a row becomes a value
// again. Inserting, finding, listing, updating and deleting are written
// once, below, for every entity; each Tx method only names the entity and
// passes its arguments, so the entities cannot drift apart in how they
// report a duplicate, a missing row or a row lock.
type entity[T any] struct {
	table string
	noun  string // names the entity in errors: "replica set"
	// key holds the columns that find, update and delete match, in the
	// order those take their values (not necessarily the primary key:
	// services are found by id AND project_id, so one project's caller
	// never reaches another's).
	key []string
	// cols holds the other columns insert writes, the doc excluded.
	cols []string
	// set holds those of cols that update rewrites; the doc is always
	// rewritten. A column not in it keeps what insert wrote.
	set []string
	// values returns the values of key, then of cols, for v.
	values func(v *T) []any
	// noDoc: every field is a column of its own (memberships).
	noDoc bool
	// read is what finders select, "doc" if empty; scan turns one row of
	// it into a value, decoding the doc if nil. Fields kept out of the
	// doc (secret hashes) are read here.
	read string
	scan func(rows *sql.Rows) (*T, error)
	// scopes, if set, are the revision scopes (dbcloud.Revisions) a write
	// of v touches.
	scopes func(v *T) []string
	// label names a row in errors from its key values; the first of them
	// if nil. It may return "" to name none (a token's hash).
	label func(key ...any) string

	insertSQL, updateSQL, deleteSQL, selectSQL, where string
	setAt                                             []int // index in values of each column update binds
}

// define completes e's queries once, at package initialisation, so a
// mistake in a declaration fails every test at once.
func define[T any](e entity[T]) *entity[T] {
	if e.read == "" {
		e.read = "doc"
	}
	if e.scan == nil {
		e.scan = scanDoc[T]
	}
	if e.label == nil {
		e.label = func(key ...any) string { return fmt.Sprint(key[0]) }
	}
	all := slices.Concat(e.key, e.cols)
	set := e.set
	if !e.noDoc {
		all, set = append(all, "doc"), append(slices.Clone(set), "doc")
	}
	e.where = strings.Join(e.key, " = ? AND ") + " = ?"
	e.insertSQL = `INSERT INTO ` + e.table + ` (` + strings.Join(all, ", ") + `) VALUES (?` +
		strings.Repeat(", ?", len(all)-1) + `) ON CONFLICT DO NOTHING`
	e.updateSQL = `UPDATE ` + e.table + ` SET ` + strings.Join(set, " = ?, ") + ` = ? WHERE ` + e.where
	e.deleteSQL = `DELETE FROM ` + e.table + ` WHERE ` + e.where
	e.selectSQL = `SELECT ` + e.read + ` FROM ` + e.table + ` `
	for _, c := range set {
		i := slices.Index(all, c)
		if i < 0 {
			panic(fmt.Sprintf("sqlstore: %s updates %s, which it does not store", e.table, c))
		}
		e.setAt = append(e.setAt, i)
	}
	return &e
}

// row returns the values of every column insert writes, doc last.
func (e *entity[T]) row(v *T) ([]any, error) {
	vals := e.values(v)
	if e.noDoc {
		return vals, nil
	}
	doc, err := encode(v)
	if err != nil {
		return nil, err
	}
	return append(vals, doc), nil
}

func (e *entity[T]) keyOf(v *T) []any { return e.values(v)[:len(e.key)] }

// name is how errors name v or the row of key.
func (e *entity[T]) name(key ...any) string {
	if l := e.label(key...); l != "" {
		return e.noun + " " + l
	}
	return e.noun
}

// insert adds v; ErrDuplicate if its key or a unique column exists.
func (e *entity[T]) insert(t *tx, v *T) error {
	e.touch(t, v)
	vals, err := e.row(v)
	if err == nil {
		err = t.insert(e.insertSQL, vals...)
	}
	if err != nil {
		return fmt.Errorf("insert %s: %w", e.name(e.keyOf(v)...), err)
	}
	return nil
}

// update rewrites v's row; ErrNotFound if there is none.
func (e *entity[T]) update(t *tx, v *T) error {
	e.touch(t, v)
	vals, err := e.row(v)
	if err == nil {
		args := make([]any, 0, len(e.setAt)+len(e.key))
		for _, i := range e.setAt {
			args = append(args, vals[i])
		}
		err = t.change(e.updateSQL, append(args, vals[:len(e.key)]...)...)
	}
	if err != nil {
		return fmt.Errorf("update %s: %w", e.name(e.keyOf(v)...), err)
	}
	return nil
}

// delete removes the row of key, touching scopes; ErrNotFound if there is
// none.
func (e *entity[T]) delete(t *tx, scopes []string, key ...any) error {
	for _, s := range scopes {
		t.touch(s)
	}
	if err := t.change(e.deleteSQL, key...); err != nil {
		return fmt.Errorf("delete %s: %w", e.name(key...), err)
	}
	return nil
}

// find returns the row of key, locked for update in write transactions.
func (e *entity[T]) find(t *tx, key ...any) (*T, error) {
	return e.findWhere(t, e.name(key...), e.where, key...)
}

// findWhere returns the one row that where selects; what names it in
// errors.
func (e *entity[T]) findWhere(t *tx, what, where string, args ...any) (*T, error) {
	vs, err := e.query(t, `WHERE `+where+t.forUpdate, args...)
	if err == nil && len(vs) == 0 {
		err = dbcloud.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", what, err)
	}
	return vs[0], nil
}

// list returns the rows that tail (WHERE ... ORDER BY ...) selects; what
// names them in errors. The result is never nil, so that an empty list
// encodes as [] wherever it ends up.
func (e *entity[T]) list(t *tx, what, tail string, args ...any) ([]*T, error) {
	vs, err := e.query(t, tail, args...)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", what, err)
	}
	return vs, nil
}

func (e *entity[T]) query(t *tx, tail string, args ...any) ([]*T, error) {
	rows, err := t.query(e.selectSQL+tail, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []*T{}
	for rows.Next() {
		v, err := e.scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func (e *entity[T]) touch(t *tx, v *T) {
	if e.scopes != nil {
		for _, s := range e.scopes(v) {
			t.touch(s)
		}
	}
}

// scanDoc decodes a row of the doc alone.
func scanDoc[T any](rows *sql.Rows) (*T, error) {
	var doc sql.RawBytes // valid until Next; decoded at once, so never copied
	if err := rows.Scan(&doc); err != nil {
		return nil, err
	}
	return decode[T](doc)
}

// scanDocAnd returns a scan of the doc and one column kept out of it, which
// reveal puts back into the decoded value.
func scanDocAnd[T, C any](reveal func(v *T, c C)) func(*sql.Rows) (*T, error) {
	return func(rows *sql.Rows) (*T, error) {
		var (
			doc sql.RawBytes
			c   C
		)
		if err := rows.Scan(&doc, &c); err != nil {
			return nil, err
		}
		v, err := decode[T](doc)
		if err != nil {
			return nil, err
		}
		reveal(v, c)
		return v, nil
	}
}
