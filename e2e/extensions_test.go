package e2e

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// requireExtension skips t when the host's PostgreSQL lacks the extension
// (scripts/deps.sh could not build it) on a developer's machine; in CI
// (CI set) a missing extension is a failure, since deps.sh must have built
// it there.
func requireExtension(t testing.TB, name string) {
	t.Helper()
	requireVersionExtension(t, 15, name)
}

// requireVersionExtension is requireExtension for PostgreSQL major.
func requireVersionExtension(t testing.TB, major int, name string) {
	t.Helper()
	out, err := exec.Command(fmt.Sprintf("/usr/lib/postgresql/%d/bin/pg_config", major), "--sharedir").Output()
	if err == nil {
		if _, err = os.Stat(filepath.Join(strings.TrimSpace(string(out)), "extension", name+".control")); err == nil {
			return
		}
	}
	msg := fmt.Sprintf("the PostgreSQL %d extension %s is not installed (scripts/deps.sh builds it): %v", major, name, err)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// createTyped creates a service and checks the type its addons give it.
func (s *server) createTyped(body map[string]any, wantType string) service {
	s.t.Helper()
	var created struct {
		service
		ServiceType string `json:"service_type"`
	}
	if code := s.call("POST", s.services(), body, &created); code != 202 || created.ServiceType != wantType {
		s.t.Fatalf("create %v: %d, type %q (%s %s); want 202 and %s", body, code, created.ServiceType, created.Code, created.Message, wantType)
	}
	return created.service
}

// tsRows rows of the hypertable m: one every 864 ms from tsStart, so 10
// days of 100,000 rows each, v running from 0.
const (
	tsRows  = 1_000_000
	tsStart = "2026-01-01 00:00:00+00"
	tsDays  = 10
)

// tsBucketsSQL is the time_bucket aggregate over m that wantBuckets answers.
const tsBucketsSQL = `SELECT to_char(day, 'YYYY-MM-DD') || ' ' || n || ' ' || total FROM (
	SELECT time_bucket('1 day', t) AS day, count(*) AS n, sum(v) AS total FROM m GROUP BY day) b ORDER BY day`

// wantBuckets is tsBucketsSQL's answer for the days from first on: day d
// holds v from d*100,000 to d*100,000+99,999.
func wantBuckets(first int) []string {
	per := int64(tsRows / tsDays)
	var out []string
	for d := first; d < tsDays; d++ {
		lo := int64(d) * per
		sum := per*lo + per*(per-1)/2
		out = append(out, fmt.Sprintf("2026-01-%02d %d %d", d+1, per, sum))
	}
	return out
}

func checkBuckets(t *testing.T, c *pgx.Conn, first int, what string) {
	t.Helper()
	if got, want := queryValues(t, c, tsBucketsSQL), wantBuckets(first); !slices.Equal(got, want) {
		t.Errorf("%s: time_bucket aggregate\n got %q\nwant %q", what, got, want)
	}
}

// superConnect logs in as the superuser over instance n's unix socket, by
// peer identity (the tests run as dbcloud's OS user), to read what
// tsdbadmin may not: shared_preload_libraries and the server's processes.
func (s *server) superConnect(t *testing.T, id string, n int) *pgx.Conn {
	t.Helper()
	pf, err := os.ReadFile(filepath.Join(s.dir, "runtime", "services", id, strconv.Itoa(n), "pgdata", "postmaster.pid"))
	lines := strings.Split(string(pf), "\n")
	if err != nil || len(lines) < 5 {
		t.Fatalf("instance %s-%d has no postmaster.pid: %v", id, n, err)
	}
	c, err := pgx.Connect(context.Background(), fmt.Sprintf("host=%s port=%s user=postgres dbname=tsdb",
		strings.TrimSpace(lines[4]), strings.TrimSpace(lines[3])))
	if err != nil {
		t.Fatalf("superuser connection to %s-%d: %v", id, n, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// timescaleSettings shows whether TimescaleDB is preloaded and its
// launcher runs (on a primary; a standby's waits for the end of recovery),
// and the settings a TIMESERIESDB service gets.
func timescaleSettings(t *testing.T, c *pgx.Conn) []string {
	t.Helper()
	return queryValues(t, c, `SELECT 'preload=' || current_setting('shared_preload_libraries')
		UNION ALL SELECT 'launcher=' || (SELECT count(*) FROM pg_stat_activity
			WHERE backend_type = 'TimescaleDB Background Worker Launcher')
		UNION ALL SELECT 'max_background_workers=' || coalesce(current_setting('timescaledb.max_background_workers', true), '')
		UNION ALL SELECT 'max_worker_processes=' || current_setting('max_worker_processes')
		UNION ALL SELECT 'telemetry_level=' || coalesce(current_setting('timescaledb.telemetry_level', true), '')`)
}

// waitTimescaleSettings polls instance n's timescaleSettings until they
// are want: the launcher starts just after the server accepts connections.
func (s *server) waitTimescaleSettings(t *testing.T, id string, n int, want []string) {
	t.Helper()
	c := s.superConnect(t, id, n)
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := timescaleSettings(t, c)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("instance %s-%d: %q, want %q", id, n, got, want)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// chunkName matches the name of a hypertable's chunk in a plan.
var chunkName = regexp.MustCompile(`_hyper_[0-9]+_[0-9]+_chunk\b`)

// TestTimescaleDB makes a TIMESERIESDB service and uses TimescaleDB as
// its tsdbadmin (no superuser): a hypertable of 1,000,000 rows in daily
// chunks, a time_bucket aggregate, show_chunks, forks (NOW, point-in-time
// and LAST_SNAPSHOT) answering the same aggregate, the service's own
// operations (stop/start, resize, password) keeping it working, and a
// retention drop_chunks.
func TestTimescaleDB(t *testing.T) {
	requireExtension(t, "timescaledb")
	t.Parallel()
	// Snapshots often enough that one holds the loaded hypertable, for a
	// LAST_SNAPSHOT fork.
	s := newServer(t, "--snapshot-interval", "40s")
	ctx := context.Background()
	created := s.createTyped(map[string]any{"name": "metrics", "addons": []string{"time-series"}, "environment_tag": "PROD"}, "TIMESERIESDB")
	svc := s.waitStatus(created.ServiceID, "READY", 90*time.Second)
	pw := created.InitialPassword
	snapshotAt := s.waitSnapshot(svc.ServiceID, time.Time{}, 60*time.Second)
	db := s.mustConnect(svc, pw)

	want := []string{"preload=timescaledb,dbcloud_guard", "launcher=1", "max_background_workers=4", "max_worker_processes=14", "telemetry_level=off"}
	s.waitTimescaleSettings(t, svc.ServiceID, 0, want)
	var super bool
	var version string
	if err := db.QueryRow(ctx, `SELECT rolsuper, (SELECT extversion FROM pg_extension WHERE extname = 'timescaledb')
		FROM pg_roles WHERE rolname = current_user`).Scan(&super, &version); err != nil || super || version == "" {
		t.Fatalf("tsdbadmin superuser %v, timescaledb version %q: %v; want a plain role and the extension", super, version, err)
	}
	t.Logf("timescaledb %s", version)

	begin := time.Now()
	if _, err := db.Exec(ctx, `CREATE TABLE m (t timestamptz NOT NULL, v bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `SELECT create_hypertable('m', by_range('t', INTERVAL '1 day'))`); err != nil {
		t.Fatalf("create_hypertable as tsdbadmin: %v", err)
	}
	if _, err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO m SELECT timestamptz '%s' + i * INTERVAL '864 ms', i
		FROM generate_series(0, %d) i`, tsStart, tsRows-1)); err != nil {
		t.Fatal(err)
	}
	t.Logf("hypertable of %d rows written in %v", tsRows, time.Since(begin).Round(time.Millisecond))
	checkBuckets(t, db, 0, "parent")
	if chunks := queryValues(t, db, `SELECT show_chunks('m')::text`); len(chunks) != tsDays {
		t.Errorf("show_chunks lists %d chunks, want %d (one a day): %q", len(chunks), tsDays, chunks)
	}
	// Chunk exclusion: a one-day query reads one chunk.
	plan := strings.Join(queryValues(t, db, `EXPLAIN SELECT count(*) FROM m WHERE t >= '2026-01-03' AND t < '2026-01-04'`), "\n")
	if chunks := slices.Compact(slices.Sorted(slices.Values(chunkName.FindAllString(plan, -1)))); len(chunks) != 1 {
		t.Errorf("a one-day query does not read exactly one chunk:\n%s", plan)
	}

	// Point-in-time target: after the load, before a later commit.
	time.Sleep(50 * time.Millisecond)
	target := time.Now().UTC()
	time.Sleep(50 * time.Millisecond)
	if _, err := db.Exec(ctx, `CREATE TABLE after_target (v int); INSERT INTO after_target VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if !target.After(snapshotAt) {
		t.Fatalf("target %v not after the first snapshot %v", target, snapshotAt)
	}

	for _, strategy := range []string{"NOW", "PITR", "LAST_SNAPSHOT"} {
		t.Run("Fork"+strategy, func(t *testing.T) {
			body := map[string]any{"fork_strategy": strategy, "name": "fork-" + strings.ToLower(strategy)}
			switch strategy {
			case "PITR":
				body["target_time"] = target.Format(time.RFC3339Nano)
			case "LAST_SNAPSHOT":
				s.waitSnapshot(svc.ServiceID, target, 2*time.Minute)
			}
			f := s.mustFork(svc, body)
			fork := s.waitStatus(f.ServiceID, "READY", 3*time.Minute)
			fc := s.mustConnect(fork, f.InitialPassword)
			s.waitTimescaleSettings(t, fork.ServiceID, 0, want)
			var late bool
			if err := fc.QueryRow(ctx, `SELECT to_regclass('after_target') IS NOT NULL`).Scan(&late); err != nil {
				t.Fatal(err)
			}
			if late != (strategy != "PITR") {
				t.Errorf("%s fork has the table made after the point-in-time target: %v", strategy, late)
			}
			checkBuckets(t, fc, 0, strategy+" fork")
			// The fork's hypertable takes new chunks.
			if _, err := fc.Exec(ctx, `INSERT INTO m VALUES ('2027-01-01', 1)`); err != nil {
				t.Errorf("insert into a new chunk on the fork: %v", err)
			}
			if chunks := queryValues(t, fc, `SELECT show_chunks('m')::text`); len(chunks) < tsDays+1 {
				t.Errorf("fork's show_chunks lists %d chunks, want at least %d", len(chunks), tsDays+1)
			}
		})
	}

	t.Run("Operations", func(t *testing.T) {
		works := func(what string) {
			t.Helper()
			checkBuckets(t, s.mustConnect(svc, pw), 0, what)
		}
		s.call("POST", s.services()+"/"+svc.ServiceID+"/stop", nil, nil)
		s.waitStatus(svc.ServiceID, "PAUSED", 60*time.Second)
		s.call("POST", s.services()+"/"+svc.ServiceID+"/start", nil, nil)
		s.waitStatus(svc.ServiceID, "READY", 60*time.Second)
		works("after stop and start")

		if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/resize", map[string]string{"cpu_millis": "2000", "memory_gbs": "8"}, nil); code != 202 {
			t.Fatalf("resize: %d", code)
		}
		s.waitStatus(svc.ServiceID, "READY", 90*time.Second)
		works("after resize")
		// 2 CPUs: 8 TimescaleDB workers plus the launcher on top of 2+8.
		s.waitTimescaleSettings(t, svc.ServiceID, 0, []string{"preload=timescaledb,dbcloud_guard", "launcher=1", "max_background_workers=8", "max_worker_processes=19", "telemetry_level=off"})

		const newPW = "timescale-password-42"
		if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/updatePassword", map[string]string{"password": newPW}, nil); code != 204 {
			t.Fatalf("updatePassword: %d", code)
		}
		pw = newPW
		works("after updatePassword")
	})

	t.Run("ReadReplicaSet", func(t *testing.T) {
		var rs replicaSet
		if code := s.call("POST", s.replicaSets(svc.ServiceID), map[string]any{"name": "reads", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}, &rs); code != 202 {
			t.Fatalf("create replica set: %d %+v", code, rs)
		}
		s.waitReplicaSet(svc.ServiceID, rs.ID, "active", 2*time.Minute)
		set, _ := s.get(rs.ID)
		rc := s.mustConnect(set, pw)
		var standby bool
		if err := rc.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); err != nil || !standby {
			t.Fatalf("the set's endpoint reached a server in recovery %v: %v", standby, err)
		}
		// A hot standby needs the primary's worker count (2 CPUs, 19) and
		// TimescaleDB preloaded to read hypertables; its launcher waits for
		// the end of recovery.
		s.waitTimescaleSettings(t, rs.ID, 0, []string{"preload=timescaledb,dbcloud_guard", "launcher=0", "max_background_workers=8", "max_worker_processes=19", "telemetry_level=off"})
		checkBuckets(t, rc, 0, "read replica")
		s.call("DELETE", s.replicaSets(svc.ServiceID)+"/"+rs.ID, nil, nil)
		s.waitReplicaSet(svc.ServiceID, rs.ID, "gone", time.Minute)
	})

	t.Run("PoolerAndLogs", func(t *testing.T) {
		if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/enablePooler", nil, nil); code != 200 {
			t.Fatalf("enablePooler: %d", code)
		}
		pc, err := pgxConnect(ctx, s.poolerDSN(s.waitPooler(svc.ServiceID, true, time.Minute), pw))
		if err != nil {
			t.Fatalf("connect through the pooler: %v", err)
		}
		defer pc.Close(ctx)
		checkBuckets(t, pc, 0, "through the pooler")
		// Policies are not in the Apache-2 edition; the refusal reaches
		// the service's logs like any error.
		if _, err := pc.Exec(ctx, `SELECT add_retention_policy('m', INTERVAL '7 days')`); err == nil || !strings.Contains(err.Error(), `"apache" license`) {
			t.Errorf("add_retention_policy: %v, want it refused under the apache license", err)
		}
		s.waitLogs(svc.ServiceID, url.Values{"search": {"add_retention_policy"}, "severities": {"ERROR"}}, 1)
		s.call("POST", s.services()+"/"+svc.ServiceID+"/disablePooler", nil, nil)
		s.waitPooler(svc.ServiceID, false, time.Minute)
	})

	t.Run("Retention", func(t *testing.T) {
		c := s.mustConnect(svc, pw)
		dropped := queryValues(t, c, `SELECT drop_chunks('m', older_than => timestamptz '2026-01-04 00:00:00+00')::text`)
		if len(dropped) != 3 {
			t.Errorf("drop_chunks dropped %d chunks, want the 3 before 2026-01-04: %q", len(dropped), dropped)
		}
		if chunks := queryValues(t, c, `SELECT show_chunks('m')::text`); len(chunks) != tsDays-3 {
			t.Errorf("%d chunks after drop_chunks, want %d", len(chunks), tsDays-3)
		}
		checkBuckets(t, c, 3, "after drop_chunks")
	})
}

// TestAddonTypes creates a service of each type and checks its extensions
// and whether TimescaleDB is preloaded: only TIMESERIESDB services pay for
// it (memory and workers), a VECTOR service has pgvector only, and both
// addons give both.
func TestAddonTypes(t *testing.T) {
	requireExtension(t, "timescaledb")
	requireExtension(t, "vector")
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	for _, c := range []struct {
		addons   []string
		typ      string
		wantExts string
		preload  []string
	}{
		{nil, "POSTGRES", "plpgsql", []string{"preload=dbcloud_guard", "launcher=0", "max_background_workers=", "max_worker_processes=9", "telemetry_level="}},
		{[]string{"ai"}, "VECTOR", "plpgsql vector", []string{"preload=dbcloud_guard", "launcher=0", "max_background_workers=", "max_worker_processes=9", "telemetry_level="}},
		{[]string{"time-series", "ai"}, "TIMESERIESDB", "plpgsql timescaledb vector",
			[]string{"preload=timescaledb,dbcloud_guard", "launcher=1", "max_background_workers=4", "max_worker_processes=14", "telemetry_level=off"}},
	} {
		body := map[string]any{"name": strings.ToLower(c.typ)}
		if c.addons != nil {
			body["addons"] = c.addons
		}
		created := s.createTyped(body, c.typ)
		svc := s.waitStatus(created.ServiceID, "READY", 90*time.Second)
		db := s.mustConnect(svc, created.InitialPassword)
		var exts string
		if err := db.QueryRow(ctx, `SELECT string_agg(extname, ' ' ORDER BY extname) FROM pg_extension`).Scan(&exts); err != nil {
			t.Fatal(err)
		}
		if exts != c.wantExts {
			t.Errorf("%s %v: extensions %q, want %q", c.typ, c.addons, exts, c.wantExts)
		}
		s.waitTimescaleSettings(t, svc.ServiceID, 0, c.preload)
		if c.typ == "TIMESERIESDB" {
			continue
		}
		// Without the preload, the tenant cannot use TimescaleDB here: the
		// server ends the session that tries.
		tc := s.mustConnect(svc, created.InitialPassword)
		if _, err := tc.Exec(ctx, `CREATE EXTENSION timescaledb`); err == nil || !strings.Contains(err.Error(), "must be preloaded") {
			t.Errorf("%s: CREATE EXTENSION timescaledb: %v, want it refused as not preloaded", c.typ, err)
		}
	}
}

// vectorGrid fills items with the points of a 10x10x10 grid, id = x +
// 10y + 100z, and returns the ids nearest to q in order of L2 distance.
func vectorGrid(q [3]float64, k int) []string {
	type hit struct {
		id   int
		dist float64
	}
	var hits []hit
	for id := range 1000 {
		x, y, z := float64(id%10), float64(id/10%10), float64(id/100)
		hits = append(hits, hit{id, math.Sqrt((x-q[0])*(x-q[0]) + (y-q[1])*(y-q[1]) + (z-q[2])*(z-q[2]))})
	}
	sort.SliceStable(hits, func(i, j int) bool { return hits[i].dist < hits[j].dist })
	var ids []string
	for _, h := range hits[:k] {
		ids = append(ids, strconv.Itoa(h.id))
	}
	return ids
}

// nearestSQL asks for the 5 items nearest to (3.1, 4.2, 5.3).
const nearestSQL = `SELECT id::text FROM items ORDER BY embedding <-> '[3.1,4.2,5.3]' LIMIT 5`

// checkNearest checks the nearest-neighbour query's answer and that it
// uses the HNSW index.
func checkNearest(t *testing.T, c *pgx.Conn, what string) {
	t.Helper()
	ctx := context.Background()
	if got, want := queryValues(t, c, nearestSQL), vectorGrid([3]float64{3.1, 4.2, 5.3}, 5); !slices.Equal(got, want) {
		t.Errorf("%s: nearest neighbours %q, want %q", what, got, want)
	}
	// 1,000 rows are few enough that the planner may prefer a sort; the
	// question is whether the index can serve the query.
	if _, err := c.Exec(ctx, `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(queryValues(t, c, "EXPLAIN "+nearestSQL), "\n")
	if !strings.Contains(plan, "Index Scan using items_embedding_idx") {
		t.Errorf("%s: the query does not use the HNSW index:\n%s", what, plan)
	}
	if _, err := c.Exec(ctx, `RESET enable_seqscan`); err != nil {
		t.Fatal(err)
	}
}

// TestPgvector makes a VECTOR service, and as tsdbadmin a vector(3)
// column with an HNSW index that answers a nearest-neighbour query, on
// the service, on a NOW fork and on a read replica set.
func TestPgvector(t *testing.T) {
	requireExtension(t, "vector")
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.createTyped(map[string]any{"name": "embeddings", "addons": []string{"ai"}, "environment_tag": "PROD"}, "VECTOR")
	svc := s.waitStatus(created.ServiceID, "READY", 90*time.Second)
	pw := created.InitialPassword
	db := s.mustConnect(svc, pw)
	if _, err := db.Exec(ctx, `CREATE TABLE items (id int PRIMARY KEY, embedding vector(3) NOT NULL);
		INSERT INTO items SELECT i, ARRAY[i % 10, i / 10 % 10, i / 100]::real[]::vector FROM generate_series(0, 999) i;
		CREATE INDEX items_embedding_idx ON items USING hnsw (embedding vector_l2_ops)`); err != nil {
		t.Fatalf("vector table and HNSW index as tsdbadmin: %v", err)
	}
	checkNearest(t, db, "primary")

	f := s.mustFork(svc, map[string]any{"fork_strategy": "NOW", "name": "embeddings-fork"})
	fork := s.waitStatus(f.ServiceID, "READY", 2*time.Minute)
	checkNearest(t, s.mustConnect(fork, f.InitialPassword), "NOW fork")

	var rs replicaSet
	if code := s.call("POST", s.replicaSets(svc.ServiceID), map[string]any{"name": "reads", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}, &rs); code != 202 {
		t.Fatalf("create replica set: %d %+v", code, rs)
	}
	s.waitReplicaSet(svc.ServiceID, rs.ID, "active", 2*time.Minute)
	set, _ := s.get(rs.ID)
	rc := s.mustConnect(set, pw)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		var standby bool
		if err := rc.QueryRow(ctx, `SELECT count(*), pg_is_in_recovery() FROM items`).Scan(&n, &standby); err != nil {
			t.Fatal(err)
		}
		if n == 1000 && standby {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica node: %d rows, in recovery %v", n, standby)
		}
		time.Sleep(50 * time.Millisecond)
	}
	checkNearest(t, rc, "read replica")
}

// TestTimescaleDB_HAFailover fails the primary of a TIMESERIESDB service
// with two standbys (one synchronous): every member preloads TimescaleDB,
// so the promoted standby answers the hypertable's aggregate and takes new
// chunks.
func TestTimescaleDB_HAFailover(t *testing.T) {
	requireExtension(t, "timescaledb")
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.createTyped(map[string]any{"name": "ha-metrics", "addons": []string{"time-series"}, "cpu_millis": "shared",
		"environment_tag": "PROD", "replica_count": 2}, "TIMESERIESDB")
	svc := s.waitStatus(created.ServiceID, "READY", 2*time.Minute)
	pw := created.InitialPassword
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/setHA", map[string]int{"replica_count": 2, "sync_replica_count": 1}, nil); code != 202 {
		t.Fatalf("setHA: %d", code)
	}
	svc = s.waitStatus(svc.ServiceID, "READY", time.Minute)
	db := s.mustConnect(svc, pw)
	if _, err := db.Exec(ctx, fmt.Sprintf(`CREATE TABLE acked (id int PRIMARY KEY); INSERT INTO acked VALUES (-1);
		CREATE TABLE m (t timestamptz NOT NULL, v bigint NOT NULL);
		SELECT create_hypertable('m', by_range('t', INTERVAL '1 day'));
		INSERT INTO m SELECT timestamptz '%s' + i * INTERVAL '864 ms', i FROM generate_series(0, %d) i`, tsStart, tsRows-1)); err != nil {
		t.Fatal(err)
	}
	// Shared size: 4 workers, 4 TimescaleDB workers and the launcher.
	primary, _ := s.haPrimary(svc.ServiceID)
	standby := (primary + 1) % 3
	s.waitTimescaleSettings(t, svc.ServiceID, standby, []string{"preload=timescaledb,dbcloud_guard", "launcher=0", "max_background_workers=4",
		"max_worker_processes=9", "telemetry_level=off"})

	// The primary's postmaster dies; the service's endpoint moves to a
	// promoted standby. (Rebuilding the old primary afterwards, and that no
	// acknowledged commit is lost, is TestHA's subject.)
	killed := time.Now()
	killPrimary(t, filepath.Join(s.dir, "runtime", "services", svc.ServiceID, strconv.Itoa(primary)))
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if now, _ := s.haPrimary(svc.ServiceID); now != primary {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no failover within 90 s of the kill")
		}
	}
	var c *pgx.Conn
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var inRecovery bool
		if conn, err := s.connect(ctx, svc, pw); err == nil {
			if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err == nil && !inRecovery {
				c = conn
				break
			}
			conn.Close(ctx)
		}
		if time.Now().After(deadline) {
			t.Fatal("the endpoint does not reach a primary within 60 s of the failover")
		}
	}
	defer c.Close(ctx)
	t.Logf("the endpoint reached the promoted standby %v after the kill", time.Since(killed).Round(time.Millisecond))
	now, _ := s.haPrimary(svc.ServiceID)
	s.waitTimescaleSettings(t, svc.ServiceID, now, []string{"preload=timescaledb,dbcloud_guard", "launcher=1", "max_background_workers=4",
		"max_worker_processes=9", "telemetry_level=off"})
	checkBuckets(t, c, 0, "after failover")
	if _, err := c.Exec(ctx, `INSERT INTO m VALUES ('2027-01-01', 1)`); err != nil {
		t.Errorf("insert into a new chunk after failover: %v", err)
	}
	if chunks := queryValues(t, c, `SELECT show_chunks('m')::text`); len(chunks) != tsDays+1 {
		t.Errorf("show_chunks after failover lists %d chunks, want %d", len(chunks), tsDays+1)
	}
}
