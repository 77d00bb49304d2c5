package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// requirePGVersion skips t when the host has no PostgreSQL major beside
// 15, whose server and dbcloud_guard scripts/deps.sh installs from Debian
// 13's binary packages (scripts/postgresql.sh): without them dbcloud
// offers 15 only, by design, so this is a skip even in CI.
func requirePGVersion(t testing.TB, major int) {
	t.Helper()
	for _, f := range []string{
		fmt.Sprintf("/usr/lib/postgresql/%d/bin/postgres", major),
		fmt.Sprintf("/usr/lib/postgresql/%d/lib/dbcloud_guard.so", major),
	} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("PostgreSQL %d is not installed on this host (%v): scripts/postgresql.sh %d and scripts/deps.sh install it", major, err, major)
		}
	}
}

// versionedService is a service with the version metadata.
type versionedService struct {
	service
	Metadata struct {
		PGVersion     int    `json:"pg_version"`
		PGVersionFull string `json:"pg_version_full"`
	} `json:"metadata"`
}

// TestPGVersions creates a service on each PostgreSQL version the host
// has (decisions.md section 11): its server says it runs that version, as
// the metadata does; on 17, the TimescaleDB and pgvector addons work and a
// fork keeps 17.
func TestPGVersions(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	t.Run("15", func(t *testing.T) {
		s.createOn(t, 15, nil)
	})
	t.Run("17", func(t *testing.T) {
		requirePGVersion(t, 17)
		requireVersionExtension(t, 17, "timescaledb")
		requireVersionExtension(t, 17, "vector")
		svc, pw := s.createOn(t, 17, []string{"time-series", "ai"})
		checkHypertableAndVector(t, s.mustConnect(svc.service, pw))
		f := s.mustFork(svc.service, map[string]any{"fork_strategy": "NOW", "name": "fork-17"})
		fork := s.waitStatus(f.ServiceID, "READY", 120*time.Second)
		fdb := s.mustConnect(fork, f.InitialPassword)
		if v := queryValues(t, fdb, `SHOW server_version`); len(v) != 1 || !strings.HasPrefix(v[0], "17.") {
			t.Errorf("the fork of a 17 runs %q, want 17", v)
		}
		if got := queryValues(t, fdb, `SELECT count(*) FROM m UNION ALL SELECT count(*) FROM items`); !slices.Equal(got, []string{"100", "3"}) {
			t.Errorf("the fork's rows: %q, want [100 3]", got)
		}
	})
}

// checkHypertableAndVector uses the addons' extensions on a service with
// both: a hypertable with rows over several days (tables m) and an HNSW
// index answering a nearest-neighbour query (table items).
func checkHypertableAndVector(t *testing.T, db *pgx.Conn) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `CREATE TABLE m (t timestamptz NOT NULL, v bigint);
		SELECT create_hypertable('m', by_range('t', INTERVAL '1 day'));
		INSERT INTO m SELECT now() - i * INTERVAL '1 hour', i FROM generate_series(1, 100) i;
		CREATE TABLE items (id int PRIMARY KEY, embedding vector(3) NOT NULL);
		INSERT INTO items VALUES (1, '[1,0,0]'), (2, '[0,1,0]'), (3, '[0,0,1]');
		CREATE INDEX ON items USING hnsw (embedding vector_l2_ops)`); err != nil {
		t.Fatalf("hypertable and vector index: %v", err)
	}
	if got := queryValues(t, db, `SELECT (count(*) = 100 AND count(DISTINCT time_bucket('1 day', t)) >= 4)::text FROM m
		UNION ALL SELECT id::text FROM (SELECT id FROM items ORDER BY embedding <-> '[0,0.9,0.1]' LIMIT 1) n`); !slices.Equal(got, []string{"true", "2"}) {
		t.Errorf("hypertable and nearest neighbour: %q, want [true 2]", got)
	}
}

// createOn creates a service on PostgreSQL major with addons, waits for
// READY and checks that its server and its metadata both say major; it
// returns the service and its password. The Kubernetes runtime does not
// read its images' full versions, so there pg_version_full is absent
// (docs/kubernetes.md).
func (s *server) createOn(t *testing.T, major int, addons []string) (versionedService, string) {
	t.Helper()
	var created versionedService
	body := map[string]any{"name": fmt.Sprintf("pg%d", major), "pg_version": major, "addons": addons}
	if code := s.call("POST", s.services(), body, &created); code != 202 {
		t.Fatalf("create on %d: %d %s %s", major, code, created.Code, created.Message)
	}
	s.waitStatus(created.ServiceID, "READY", readyWithin())
	var got versionedService
	if code := s.call("GET", s.services()+"/"+created.ServiceID, nil, &got); code != 200 {
		t.Fatalf("GET %s: %d", created.ServiceID, code)
	}
	db := s.mustConnect(got.service, created.InitialPassword)
	v := queryValues(t, db, `SHOW server_version`)
	full := got.Metadata.PGVersionFull + " " // "17.6 (Debian ...)" begins "17.6 "
	if onKubernetes() && got.Metadata.PGVersionFull == "" {
		full = fmt.Sprintf("%d.", major)
	}
	if len(v) != 1 || got.Metadata.PGVersion != major || !strings.HasPrefix(v[0]+" ", full) ||
		!strings.HasPrefix(v[0], fmt.Sprintf("%d.", major)) {
		t.Errorf("service asked on %d: server_version %q, metadata pg_version %d, pg_version_full %q",
			major, v, got.Metadata.PGVersion, got.Metadata.PGVersionFull)
	}
	return got, created.InitialPassword
}
