package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"dbcloud"
)

// TestMigrateServicePGVersion upgrades a store made before services chose
// a PostgreSQL version: each service runs 15, in its document and column.
func TestMigrateServicePGVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dbcloud.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	db.Exec(`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied TEXT NOT NULL)`)
	files, _ := filepath.Glob(filepath.Join("migrations", "*.sql"))
	for _, f := range files {
		v, _ := strconv.Atoi(strings.SplitN(filepath.Base(f), "_", 2)[0])
		if v >= 34 {
			continue // what the test upgrades to
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(string(b)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		db.Exec(`INSERT INTO schema_migrations VALUES (?, '2026-01-01T00:00:00.000000000Z')`, v)
	}
	const ts = "2026-01-01T00:00:00.000000000Z"
	if _, err := db.Exec(`INSERT INTO services (id, project_id, created, doc) VALUES ('svc0000001', 'proj000001', ?, ?)`, ts,
		`{"id":"svc0000001","project_id":"proj000001","name":"old","created":"`+ts+`","spec":{"size":{"cpu_millis":500,"memory_gbs":2},"environment":"DEV","replicas":0,"sync_replicas":0,"pooler":false,"running":true},"generation":1,"password_verifier":"","status":"READY","observed_generation":1}`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s := MustOpen(t, path)
	err = s.View(context.Background(), func(tx dbcloud.Tx) error {
		svc, err := tx.FindService("proj000001", "svc0000001")
		if err != nil {
			return err
		}
		if svc.Spec.PGVersion != 15 || svc.Name != "old" || svc.Status != dbcloud.StatusReady {
			t.Errorf("service after the migration: pg_version %d, name %q, status %s; want 15, old, READY",
				svc.Spec.PGVersion, svc.Name, svc.Status)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var col int
	if err := raw.QueryRow(`SELECT pg_version FROM services WHERE id = 'svc0000001'`).Scan(&col); err != nil || col != 15 {
		t.Errorf("pg_version column = %d, %v; want 15", col, err)
	}
}
