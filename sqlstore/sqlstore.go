// Package sqlstore implements dbcloud.Store once, over database/sql, for
// every SQL database the product supports. What differs between databases
// (placeholders, how a unique violation looks, how a project is locked, the
// DDL) is a small Dialect, supplied by the sqlite and postgres packages, so
// the two stores cannot drift apart in behaviour: one conformance suite
// (package storetest) proves them equal.
//
// Each entity is stored as a JSON document in a doc column, beside copies of
// the fields that lookups and ordering need (id, project_id, created, ...).
// Adding a field to an entity therefore needs no migration; adding a lookup
// does.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"time"

	"dbcloud"
)

var _ dbcloud.Store = (*Store)(nil)

// Placeholder is how a database numbers query parameters. Queries in this
// package are written with '?' and rebound once per query text.
type Placeholder int

// Placeholder styles.
const (
	// QuestionMark keeps '?' (SQLite, MySQL).
	QuestionMark Placeholder = iota
	// Dollar numbers parameters $1, $2, ... (PostgreSQL).
	Dollar
)

// Dialect is everything that differs between the SQL databases a Store runs
// on. Keep it small: behaviour that can be written once in portable SQL
// belongs in this package, not here.
type Dialect struct {
	// Name names the database in errors ("sqlite", "postgres").
	Name string
	// Placeholder is the parameter style of the driver.
	Placeholder Placeholder
	// Migrations holds the schema as files NNNN_description.sql at its
	// root, applied in version order, each in its own transaction.
	Migrations fs.FS
	// IsUniqueViolation reports whether err is the driver's error for a
	// duplicate primary or unique key; such errors become dbcloud.ErrDuplicate.
	IsUniqueViolation func(err error) bool
	// IsDiskFull reports whether err is the database's refusal to write
	// for want of disk space; such errors become dbcloud.ErrStoreFull.
	// Nil: never.
	IsDiskFull func(err error) bool
	// LockProject serialises the write transactions that lock the same
	// project until they end. Nil means the database already serialises all
	// writers (SQLite), so there is nothing to do.
	LockProject func(ctx context.Context, tx *sql.Tx, projectID string) error
	// LockMigrations, if set, runs first in every migration transaction so
	// that processes opening the same database at once migrate it in turn.
	LockMigrations func(ctx context.Context, tx *sql.Tx) error
	// ForUpdate is appended to the queries of finders in write
	// transactions: " FOR UPDATE" where writers are not serialised anyway,
	// so that a read-modify-write of one row by two transactions cannot
	// lose either change; "" for SQLite, which has one writer at a time.
	ForUpdate string
	// OneWriter says the database runs one write transaction at a time
	// (SQLite): Update then queues writers in arrival order before they
	// begin. database/sql hands a freed connection to a random waiter,
	// which under load left some writers waiting over a second while
	// later ones went first.
	OneWriter bool
	// WaitDurable, if set, is called after each commit of Update and
	// returns once that commit is durable, or why it may not be: a
	// dialect that commits without syncing syncs many commits at once
	// (group commit) and Update answers only after that.
	WaitDurable func() error
	// UpdateTx and ViewTx are the options of the transactions of Update and
	// View. ViewTx must make the transaction read-only where the database
	// can (SQLite enforces it on the read pool instead, with query_only).
	UpdateTx, ViewTx sql.TxOptions
}

// Store implements dbcloud.Store over database/sql. Create it with Open.
type Store struct {
	db      *sql.DB // read-write transactions and migrations
	readDB  *sql.DB // read-only transactions; may be db
	dialect Dialect

	// writer, when the dialect has OneWriter, is held by the one Update
	// running and handed on first come, first served.
	writer *writerTurn

	// rebound caches the dialect's text of each query, keyed by the
	// '?'-text, so rebinding costs one map lookup per statement.
	rebound sync.Map // string -> string

	// revStmt reads a revision counter; prepared once (per connection,
	// by database/sql) because it runs on every cached read that misses
	// the counters kept in memory.
	revMu    sync.Mutex
	revStmts map[int]*sql.Stmt // by number of scopes
	// revs keeps the counters in memory (revision.go).
	revs revisionCache
	// afterCommit, if set, runs after each commit that moved a counter
	// (AfterCommit).
	afterCommit func(committed time.Time)

	closeOnce sync.Once
	closeErr  error
}

// Open returns a Store over db, migrating its schema to the latest version
// first. View transactions use readDB, which may be db itself; SQLite passes
// a separate pool of read-only connections so that readers never queue behind
// the single writer. The Store owns both pools from then on and closes them
// in Close, also when Open fails.
func Open(ctx context.Context, db, readDB *sql.DB, d Dialect) (*Store, error) {
	if readDB == nil {
		readDB = db
	}
	s := &Store{db: db, readDB: readDB, dialect: d}
	if d.OneWriter {
		s.writer = &writerTurn{}
	}
	if d.IsUniqueViolation == nil || d.Migrations == nil {
		_ = s.Close()
		return nil, fmt.Errorf("open %s store: dialect needs IsUniqueViolation and Migrations", d.Name)
	}
	if err := s.migrate(ctx); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("open %s store: %w", d.Name, err)
	}
	return s, nil
}

// View runs fn in a read-only transaction.
func (s *Store) View(ctx context.Context, fn func(dbcloud.Tx) error) error {
	return s.run(ctx, s.readDB, &s.dialect.ViewTx, "", fn)
}

// Update runs fn in a read-write transaction, committed when fn returns nil
// and rolled back otherwise (also when fn panics). It returns once the
// commit is durable.
func (s *Store) Update(ctx context.Context, fn func(dbcloud.Tx) error) error {
	if err := s.commitWrite(ctx, fn); err != nil {
		return err
	}
	if s.dialect.WaitDurable == nil {
		return nil
	}
	// Outside the writer's turn, so the next writer runs during the sync.
	if err := s.dialect.WaitDurable(); err != nil {
		return fmt.Errorf("commit %s transaction: %w", s.dialect.Name, err)
	}
	return nil
}

// commitWrite runs fn in a write transaction, in the writer's turn where
// the database has one writer.
func (s *Store) commitWrite(ctx context.Context, fn func(dbcloud.Tx) error) error {
	if s.writer != nil {
		if err := s.writer.lock(ctx); err != nil {
			return fmt.Errorf("begin %s transaction: %w", s.dialect.Name, err)
		}
		defer s.writer.unlock()
	}
	return s.run(ctx, s.db, &s.dialect.UpdateTx, s.dialect.ForUpdate, fn)
}

func (s *Store) run(ctx context.Context, db *sql.DB, opts *sql.TxOptions, forUpdate string, fn func(dbcloud.Tx) error) error {
	sqlTx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin %s transaction: %w", s.dialect.Name, err)
	}
	// After Commit this is a no-op; on an error or a panic in fn it undoes
	// everything fn wrote.
	defer func() { _ = sqlTx.Rollback() }()
	t := &tx{ctx: ctx, tx: sqlTx, s: s, forUpdate: forUpdate}
	if err := fn(t); err != nil {
		return err
	}
	if err := t.bumpRevisions(); err != nil {
		return err
	}
	if err := s.commit(sqlTx, !opts.ReadOnly, t.bumped); err != nil {
		return fmt.Errorf("commit %s transaction: %w", s.dialect.Name, s.formatError(err))
	}
	// After Commit, so the connection is back in the pool meanwhile; only
	// writes move counters, and the dialects that wait here (PostgreSQL)
	// have no writer's turn held around run.
	if len(t.bumped) > 0 && s.afterCommit != nil {
		s.afterCommit(time.Now())
	}
	return nil
}

// Close closes the database pools. It is safe to call more than once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		s.revMu.Lock()
		for _, stmt := range s.revStmts {
			errs = append(errs, stmt.Close())
		}
		s.revMu.Unlock()
		if s.readDB != s.db {
			errs = append(errs, s.readDB.Close())
		}
		errs = append(errs, s.db.Close())
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// DB returns the read-write pool, for tests and maintenance tools that need
// to reach below the Store interface.
func (s *Store) DB() *sql.DB { return s.db }

// ReadDB returns the pool of read-only transactions (DB itself where the
// database has no separate one), for tests.
func (s *Store) ReadDB() *sql.DB { return s.readDB }

// rebind returns query in the dialect's placeholder style.
func (s *Store) rebind(query string) string {
	if s.dialect.Placeholder == QuestionMark {
		return query
	}
	if q, ok := s.rebound.Load(query); ok {
		return q.(string)
	}
	q := Rebind(s.dialect.Placeholder, query)
	s.rebound.Store(query, q)
	return q
}

// Rebind rewrites the '?' parameters of query into style p. A '?' inside a
// single-quoted literal or a double-quoted identifier is left alone.
func Rebind(p Placeholder, query string) string {
	if p == QuestionMark || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 8)
	n := 0
	var quote byte
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// formatError maps driver errors the domain acts on to its sentinels.
func (s *Store) formatError(err error) error {
	switch {
	case err == nil:
		return nil
	case s.dialect.IsUniqueViolation(err):
		return fmt.Errorf("%w (%v)", dbcloud.ErrDuplicate, err)
	case s.dialect.IsDiskFull != nil && s.dialect.IsDiskFull(err):
		return fmt.Errorf("%w (%v)", dbcloud.ErrStoreFull, err)
	}
	return err
}
