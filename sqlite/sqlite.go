// Package sqlite is the default store: one SQLite file, through the pure-Go
// driver modernc.org/sqlite, so the binary needs no cgo.
//
// SQLite allows one writer at a time. Rather than letting concurrent writers
// collide and fail with SQLITE_BUSY, all writes go through a pool of exactly
// one connection whose transactions start with BEGIN IMMEDIATE: writers queue
// in database/sql for that connection (honouring their contexts), and the
// write lock is taken when the transaction begins, never upgraded midway.
// Reads use a separate pool of query_only connections; in WAL mode they see
// the last committed state and neither wait for the writer nor block it.
//
// Commits are not synced one by one while the writer waits: the writer runs
// at synchronous=NORMAL and each Update waits after its commit for an fsync
// of the WAL shared with every other commit made meanwhile (group commit;
// see groupSync for what is on disk when a write is answered).
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"dbcloud"
	"dbcloud/sqlstore"
)

var _ dbcloud.Store = (*Store)(nil)

//go:embed migrations/*.sql
var migrations embed.FS

// busyTimeoutMS is how long a connection waits for a lock held by another
// process (a backup, the sqlite3 shell) before failing. Within one process
// writers never wait on SQLite's lock: they queue for the write connection.
const busyTimeoutMS = 5000

// Store is the SQLite store. All of its behaviour is sqlstore's.
type Store struct {
	*sqlstore.Store
	// wal syncs the write-ahead log for group commit (durable.go); index
	// maps its index header, which every commit moves (walindex.go).
	wal   *groupSync
	index *walIndex
}

// Dialect is SQLite's sqlstore.Dialect.
var Dialect = sqlstore.Dialect{
	Name:              "sqlite",
	Placeholder:       sqlstore.QuestionMark,
	Migrations:        mustSub(migrations, "migrations"),
	IsUniqueViolation: isUniqueViolation,
	IsDiskFull:        isDiskFull,
	// LockProject is nil: the one write connection and BEGIN IMMEDIATE
	// already serialise all writers, which queue in arrival order.
	OneWriter: true,
	// A read-only transaction begins with a plain BEGIN; modernc ignores
	// _txlock for it. The read pool is query_only besides.
	ViewTx: sql.TxOptions{ReadOnly: true},
}

// Open opens (creating if needed) the database file at path, migrates it and
// returns a Store. The file is put in WAL mode. path must name a file:
// ":memory:" is refused because the read and write pools would each get an
// empty database of their own; tests use a file in t.TempDir() instead.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") || strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("open sqlite store: path %q must be a plain file name", path)
	}
	// The store holds key hashes and password verifiers: only its owner may
	// read it. SQLite gives the -wal and -shm files the same mode.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open sqlite store: %w", err)
	}
	f.Close()
	write, err := sql.Open("sqlite", path+fmt.Sprintf(
		"?_busy_timeout=%d&_journal_mode=WAL&_synchronous=NORMAL&_foreign_keys=1&_txlock=immediate", busyTimeoutMS))
	if err != nil {
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	write.SetConnMaxLifetime(0)
	write.SetConnMaxIdleTime(0)
	// Connect the writer first: it turns the file into WAL mode, which the
	// readers then find.
	if err := write.PingContext(ctx); err != nil {
		_ = write.Close()
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	wal := newGroupSync(path + "-wal")

	read, err := sql.Open("sqlite", path+fmt.Sprintf(
		"?_busy_timeout=%d&_foreign_keys=1&_query_only=1", busyTimeoutMS))
	if err != nil {
		_ = write.Close()
		_ = wal.close()
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	readers := max(4, runtime.GOMAXPROCS(0))
	read.SetMaxOpenConns(readers)
	read.SetMaxIdleConns(readers)

	d := Dialect
	d.WaitDurable = wal.wait
	s, err := sqlstore.Open(ctx, write, read, d)
	if err != nil {
		_ = wal.close()
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	index, err := openWALIndex(path)
	if err != nil {
		_ = s.Close()
		_ = wal.close()
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	// Every API read asks for the change counters: answered from memory
	// while no other process's commit moved the WAL index, they cost no
	// connection of the read pool, for which requests queued.
	s.KeepRevisionsWhile(index.version, nextVersion)
	return &Store{Store: s, wal: wal, index: index}, nil
}

// Close closes the database, then the WAL file held for syncing and the
// WAL index: closing the last connection checkpoints the WAL into the
// database file and syncs it, so nothing committed needs the held file
// afterwards.
func (s *Store) Close() error {
	err := errors.Join(s.Store.Close(), s.wal.close())
	if s.index != nil {
		err = errors.Join(err, s.index.Close())
	}
	return err
}

// isUniqueViolation reports a PRIMARY KEY or UNIQUE constraint failure.
func isUniqueViolation(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() {
	case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
		return true
	}
	return false
}

// isDiskFull reports SQLITE_FULL, which SQLite returns when a write
// fails with ENOSPC (or the database reached max_page_count); the
// transaction is rolled back whole.
func isDiskFull(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_FULL
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err) // dir is a constant that go:embed has checked
	}
	return sub
}
