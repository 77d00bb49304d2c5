// Package postgres is the store for installations that run several control
// plane replicas, or that want their state in a database they already
// operate. It shares all of its behaviour with the SQLite store through
// sqlstore; this package holds what PostgreSQL does differently.
//
// Write transactions run at READ COMMITTED, and LockProject takes a
// transaction-scoped advisory lock on the project. Each statement after the
// lock sees everything that earlier holders of the lock committed, so checks
// such as quotas hold under concurrent requests, while writers of different
// projects never wait for each other. Finders in write transactions lock the
// row they return (SELECT ... FOR UPDATE), so that two transactions that read
// and then update one row, without LockProject, cannot lose either change:
// what SQLite gives by having one writer at a time. View transactions are
// REPEATABLE READ READ ONLY: one snapshot for the whole View, as in SQLite.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"dbcloud"
	"dbcloud/sqlstore"
)

var _ dbcloud.Store = (*Store)(nil)

//go:embed migrations/*.sql
var migrations embed.FS

// MaxConns bounds the connections one Store opens. Past it, transactions
// queue in the pool instead of failing with "too many clients" on the
// server, whose default max_connections is 100.
const MaxConns = 20

// SQLSTATEs the store acts on: a duplicate key, and a write refused for
// want of disk space.
const (
	uniqueViolation = "23505"
	diskFull        = "53100"
)

// Store is the PostgreSQL store. All of its behaviour is sqlstore's.
type Store struct {
	*sqlstore.Store
	follow *follower
	planes *planes
}

// Dialect is PostgreSQL's sqlstore.Dialect.
var Dialect = sqlstore.Dialect{
	Name:              "postgres",
	Placeholder:       sqlstore.Dollar,
	Migrations:        mustSub(migrations, "migrations"),
	IsUniqueViolation: isUniqueViolation,
	IsDiskFull:        isDiskFull,
	LockProject:       lockProject,
	LockMigrations:    lockMigrations,
	ForUpdate:         " FOR UPDATE",
	UpdateTx:          sql.TxOptions{Isolation: sql.LevelReadCommitted},
	ViewTx:            sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true},
}

// Open connects to the database dsn names (a postgres:// URL or key=value
// string, as pgx accepts), migrates it and returns a Store. Several
// processes may Open one database at once: they migrate it in turn.
func Open(ctx context.Context, dsn string) (*Store, error) {
	return open(ctx, dsn, dsn)
}

// open is Open with the follower's connection made to followDSN, the same
// database as dsn by another way (a test stalls it there).
func open(ctx context.Context, dsn, followDSN string) (*Store, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	db.SetMaxOpenConns(MaxConns)
	db.SetMaxIdleConns(MaxConns)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	s, err := sqlstore.Open(ctx, db, db, Dialect)
	if err != nil {
		return nil, err
	}
	// Every API read asks for the change counters; a connection of its
	// own keeps them in memory (follow.go), so those reads cost no query,
	// and writes wait for the other planes instead (planes.go).
	cfg, err := connConfig(dsn)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	followCfg, err := connConfig(followDSN)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	p, err := newPlanes(cfg, s)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	s.LeaseRevisions()
	s.AfterCommit(p.awaitSeen)
	f := startFollower(followCfg, s, p)
	p.start()
	return &Store{Store: s, follow: f, planes: p}, nil
}

// Close stops following the counters, says goodbye to the other planes
// and closes the pool. In this order, a plane that said bye no longer
// answers from memory (planes.go).
func (s *Store) Close() error {
	if s.follow != nil {
		s.follow.stop()
	}
	if s.planes != nil {
		s.planes.stop()
	}
	return s.Store.Close()
}

// Advisory lock keys live in one 64-bit space shared with anything else
// that uses advisory locks on the database, so each key hashes a prefix
// naming what it locks.
func lockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("dbcloud/" + name))
	return int64(h.Sum64())
}

var migrationsKey = lockKey("migrations")

func lockProject(ctx context.Context, tx *sql.Tx, projectID string) error {
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey("project/"+projectID))
	return err
}

func lockMigrations(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationsKey)
	return err
}

func isUniqueViolation(err error) bool {
	var e *pgconn.PgError
	return errors.As(err, &e) && e.Code == uniqueViolation
}

func isDiskFull(err error) bool {
	var e *pgconn.PgError
	return errors.As(err, &e) && e.Code == diskFull
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err) // dir is a constant that go:embed has checked
	}
	return sub
}
