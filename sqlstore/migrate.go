package sqlstore

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Migration is one versioned schema change, embedded in the binary.
type Migration struct {
	Version int
	Name    string // file name, for errors
	SQL     string
}

// migrationsTable is the same in every dialect, so it is created here rather
// than in each dialect's first migration: the version check must work before
// any migration has run.
const migrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version INTEGER PRIMARY KEY,
	applied TEXT NOT NULL
)`

// LoadMigrations reads the files NNNN_description.sql at the root of fsys,
// sorted by version. Other files are ignored; two files with one version, or
// a version below 1, are an error, because applying them in an order nobody
// chose would give databases with different schemas.
func LoadMigrations(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || path.Ext(name) != ".sql" {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_description.sql with NNNN >= 1", name)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s have the same version %d", prev, name, v)
		}
		seen[v] = name
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// migrate applies the dialect's migrations that the database lacks, in
// version order, each in its own transaction together with its row in
// schema_migrations, so a crash leaves the schema at some whole version.
func (s *Store) migrate(ctx context.Context) error {
	migs, err := LoadMigrations(s.dialect.Migrations)
	if err != nil {
		return err
	}
	latest := 0
	if len(migs) > 0 {
		latest = migs[len(migs)-1].Version
	}
	if err := s.checkSchemaVersion(ctx, latest); err != nil {
		return err
	}
	for _, m := range migs {
		if err := s.applyMigration(ctx, m); err != nil {
			return fmt.Errorf("migration %s: %w", m.Name, err)
		}
	}
	return nil
}

// checkSchemaVersion refuses a database migrated by a newer binary: this one
// would not know what the newer columns and tables mean.
func (s *Store) checkSchemaVersion(ctx context.Context, latest int) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if s.dialect.LockMigrations != nil {
		if err := s.dialect.LockMigrations(ctx, tx); err != nil {
			return fmt.Errorf("lock migrations: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, migrationsTable); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var current int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if current > latest {
		return fmt.Errorf("database schema version %d is newer than this binary's %d; upgrade the binary", current, latest)
	}
	return tx.Commit()
}

func (s *Store) applyMigration(ctx context.Context, m Migration) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if s.dialect.LockMigrations != nil {
		if err := s.dialect.LockMigrations(ctx, tx); err != nil {
			return fmt.Errorf("lock migrations: %w", err)
		}
	}
	var n int
	err = tx.QueryRowContext(ctx, s.rebind(`SELECT COUNT(*) FROM schema_migrations WHERE version = ?`), m.Version).Scan(&n)
	if err != nil {
		return fmt.Errorf("read schema_migrations: %w", err)
	}
	if n > 0 {
		return nil // applied earlier, or by a process that held the lock first
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, s.rebind(`INSERT INTO schema_migrations (version, applied) VALUES (?, ?)`),
		m.Version, formatTime(time.Now()))
	if err != nil {
		return fmt.Errorf("record version: %w", err)
	}
	return tx.Commit()
}
