package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"dbcloud/history"

	"dbcloud"
	"dbcloud/postgres"
	"dbcloud/sqlite"
)

// openStore opens the configured store: SQLite in the data directory by
// default, PostgreSQL when --store is a postgres:// URL. Every change made
// through it that a client may follow is recorded as an event with it.
func openStore(ctx context.Context, dataDir, url string) (dbcloud.Store, error) {
	s, err := openRawStore(ctx, dataDir, url)
	if err != nil {
		return nil, err
	}
	return history.NewEventStore(s), nil
}

func openRawStore(ctx context.Context, dataDir, url string) (dbcloud.Store, error) {
	switch {
	case url == "" || url == "sqlite":
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return nil, fmt.Errorf("data directory: %w", err)
		}
		s, err := sqlite.Open(ctx, filepath.Join(dataDir, "dbcloud.db"))
		if err != nil {
			return nil, fmt.Errorf("open SQLite store: %w", err)
		}
		return s, nil
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		s, err := postgres.Open(ctx, url)
		if err != nil {
			// The URL may hold a password: name only its kind.
			return nil, fmt.Errorf("open PostgreSQL store: %w", err)
		}
		return s, nil
	}
	return nil, fmt.Errorf("--store: want empty (SQLite) or a postgres:// URL")
}
