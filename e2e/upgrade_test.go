package e2e

import (
	"context"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// upgradeWithin bounds one IN_PLACE upgrade of a small service on a busy
// machine: a rehearsal (copy, pg_upgrade --check, pg_upgrade, a query per
// database), a snapshot, pg_upgrade of the service and a standby copied
// again.
const upgradeWithin = 6 * time.Minute

// TestUpgrade_InPlace upgrades a PostgreSQL 15 service with rows, an extra
// role, a TimescaleDB hypertable, a pgvector index, a synchronous HA standby and a
// read replica set to 17
// in place (decisions.md section 11), with a restart of dbcloud right after
// the upgrade was accepted: it completes anyway. Afterwards the server
// says 17 and so does the metadata, every row and index is there, the old
// passwords work, the standby streams from the new primary, the read
// replica set serves 17 with the rows, and the event
// stream has the upgrade's steps under its operation.
func TestUpgrade_InPlace(t *testing.T) {
	t.Parallel()
	requirePGVersion(t, 17)
	requireVersionExtension(t, 17, "timescaledb")
	requireVersionExtension(t, 17, "vector")
	s := newServer(t)
	ctx := context.Background()
	var created versionedService
	body := map[string]any{"name": "up15", "pg_version": 15, "addons": []string{"time-series", "ai"}, "replica_count": 1,
		"environment_tag": "PROD"}
	if code := s.call("POST", s.services(), body, &created); code != 202 {
		t.Fatalf("create on 15: %d %s", code, created.Message)
	}
	s.waitStatus(created.ServiceID, "READY", 3*time.Minute)
	// The standby synchronous: what the upgrade writes before it is
	// copied again must not wait for it.
	if code := s.call("POST", s.services()+"/"+created.ServiceID+"/setHA", map[string]int{"replica_count": 1, "sync_replica_count": 1}, nil); code != 202 {
		t.Fatalf("setHA: %d", code)
	}
	svc := s.waitStatus(created.ServiceID, "READY", 3*time.Minute)
	pw := created.InitialPassword
	db := s.mustConnect(svc, pw)
	if _, err := db.Exec(ctx, `CREATE TABLE m (t timestamptz NOT NULL, v bigint);
		SELECT create_hypertable('m', by_range('t', INTERVAL '1 day'));
		INSERT INTO m SELECT now() - i * INTERVAL '1 hour', i FROM generate_series(1, 500) i;
		CREATE TABLE items (id int PRIMARY KEY, embedding vector(3) NOT NULL);
		INSERT INTO items SELECT i, ARRAY[i, i % 7, i % 13]::vector FROM generate_series(1, 300) i;
		CREATE INDEX items_hnsw ON items USING hnsw (embedding vector_l2_ops);
		CREATE TABLE kv (k text PRIMARY KEY, v text);
		CREATE INDEX kv_v ON kv (v);
		INSERT INTO kv SELECT 'k' || i, md5(i::text) FROM generate_series(1, 1000) i;
		CREATE ROLE app LOGIN PASSWORD 'app-secret-1'`); err != nil {
		t.Fatalf("data on 15: %v", err)
	}
	const facts = `SELECT (SELECT count(*) FROM m)::text UNION ALL SELECT (SELECT sum(v) FROM m)::text
		UNION ALL SELECT (SELECT count(*) FROM items)::text UNION ALL SELECT (SELECT count(*) FROM kv)::text
		UNION ALL SELECT (SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes WHERE tablename IN ('items', 'kv'))`
	before := queryValues(t, db, facts)
	db.Close(ctx)
	var set replicaSet
	if code := s.call("POST", s.replicaSets(svc.ServiceID), map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}, &set); code != 202 {
		t.Fatalf("create replica set: %d %s", code, set.Message)
	}
	set = s.waitReplicaSet(svc.ServiceID, set.ID, "active", 3*time.Minute)

	var accepted versionedService
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/upgrade", map[string]any{"pg_version": 17, "method": "IN_PLACE"}, &accepted); code != 202 || accepted.Status != "UPGRADING" {
		t.Fatalf("upgrade: %d %s %s %s", code, accepted.Status, accepted.Code, accepted.Message)
	}
	// Accepted is durable: a restart of dbcloud does not lose it.
	s.restart()
	svc = s.waitStatus(svc.ServiceID, "READY", upgradeWithin)
	var got versionedService
	if code := s.call("GET", s.services()+"/"+svc.ServiceID, nil, &got); code != 200 || got.Metadata.PGVersion != 17 || !strings.HasPrefix(got.Metadata.PGVersionFull, "17.") {
		t.Fatalf("after the upgrade: %d, metadata %+v, reason %q", code, got.Metadata, got.StatusReason)
	}
	if got.Endpoint != svc.Endpoint || got.Endpoint != created.Endpoint {
		t.Errorf("endpoint moved: %+v, was %+v", got.Endpoint, created.Endpoint)
	}
	db = s.mustConnect(svc, pw)
	if v := queryValues(t, db, `SHOW server_version`); len(v) != 1 || !strings.HasPrefix(v[0], "17.") {
		t.Errorf("server_version %q after the upgrade, want 17", v)
	}
	if after := queryValues(t, db, facts); !slices.Equal(after, before) {
		t.Errorf("rows and indexes: %q after the upgrade, %q before", after, before)
	}
	if got := queryValues(t, db, `SELECT id::text FROM (SELECT id FROM items ORDER BY embedding <-> '[5,5,5]' LIMIT 1) n`); len(got) != 1 {
		t.Errorf("nearest neighbour after the upgrade: %q", got)
	}
	app := svc
	appDSN := strings.Replace(s.dsn(app, "app-secret-1"), "tsdbadmin:", "app:", 1)
	if c, err := pgx.Connect(ctx, appDSN); err != nil {
		t.Errorf("the extra role's password after the upgrade: %v", err)
	} else {
		c.Close(ctx)
	}
	// The standby is copied again from the new primary and streams.
	deadline := time.Now().Add(2 * time.Minute)
	for queryValues(t, db, `SELECT count(*)::text FROM pg_stat_replication`)[0] == "0" {
		if time.Now().After(deadline) {
			t.Fatal("no standby streams from the upgraded primary")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The read replica set is copied again from the new primary.
	reader := svc
	reader.Endpoint = *set.Endpoint
	deadline = time.Now().Add(3 * time.Minute)
	for {
		var version string
		var rows int
		c, err := s.connect(ctx, reader, pw)
		if err == nil {
			err = c.QueryRow(ctx, `SELECT current_setting('server_version'), (SELECT count(*) FROM kv)::int`).Scan(&version, &rows)
			c.Close(ctx)
		}
		if err == nil && strings.HasPrefix(version, "17.") && rows == 1000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the read replica set after the upgrade: version %q, %d rows, %v", version, rows, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var op *opJSON
	for _, o := range s.operations(svc.ServiceID) {
		if o.Type == "upgrade_service" {
			op = &o
			break
		}
	}
	if op == nil || op.State != "succeeded" {
		t.Fatalf("upgrade operation: %+v", op)
	}
	evctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stream, closeStream := s.events(evctx, "0")
	defer closeStream()
	var steps []string
	readUntil(t, stream, 0, func(e streamEvent) bool {
		if e.Type == "service.upgrade_step" && e.OperationID == op.ID {
			steps = append(steps, e.Status)
			if e.Status == "extensions" && strings.Contains(e.Reason, "not updated") {
				t.Errorf("extensions step: %s", e.Reason)
			}
		}
		return e.Type == "operation.finished" && e.OperationID == op.ID
	})
	for _, want := range []string{"rehearsal_check", "rehearsal_upgrade", "rehearsal_verify", "snapshot", "stop", "pg_upgrade", "start", "extensions", "analyze"} {
		if !slices.Contains(steps, want) {
			t.Errorf("step %s missing from the upgrade's events %q", want, steps)
		}
	}
}

// TestUpgrade_RehearsalFails upgrades a 15 service whose table has a
// column of a reg* type, which pg_upgrade refuses: the rehearsal fails, so
// the service itself is never touched; it is READY on 15 with its data,
// the reason names what pg_upgrade refused, the operation failed, and
// pg_upgrade's output is in the service's log.
func TestUpgrade_RehearsalFails(t *testing.T) {
	t.Parallel()
	requirePGVersion(t, 17)
	s := newServer(t)
	ctx := context.Background()
	svc, pw := s.createOn(t, 15, nil)
	db := s.mustConnect(svc.service, pw)
	if _, err := db.Exec(ctx, `CREATE TABLE f (id int PRIMARY KEY, fn regproc);
		INSERT INTO f SELECT i, 'now'::regproc FROM generate_series(1, 50) i`); err != nil {
		t.Fatalf("reg* column: %v", err)
	}
	db.Close(ctx)
	var accepted service
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/upgrade", map[string]any{"pg_version": 17}, &accepted); code != 202 || accepted.Status != "UPGRADING" {
		t.Fatalf("upgrade: %d %s %s", code, accepted.Status, accepted.Message)
	}
	// UPGRADING is stored with the accepted request: the next READY is
	// the upgrade's end.
	back := s.waitStatus(svc.ServiceID, "READY", upgradeWithin)
	if !strings.Contains(back.StatusReason, "reg*") || !strings.Contains(back.StatusReason, "PostgreSQL 15") {
		t.Errorf("status_reason %q: want what pg_upgrade refused (reg*) and that it runs 15", back.StatusReason)
	}
	db = s.mustConnect(back, pw)
	if v := queryValues(t, db, `SHOW server_version`); len(v) != 1 || !strings.HasPrefix(v[0], "15.") {
		t.Errorf("server_version %q after the failed rehearsal, want 15", v)
	}
	if got := queryValues(t, db, `SELECT count(*)::text FROM f`); !slices.Equal(got, []string{"50"}) {
		t.Errorf("rows after the failed rehearsal: %q", got)
	}
	var op *opJSON
	for _, o := range s.operations(svc.ServiceID) {
		if o.Type == "upgrade_service" {
			op = &o
			break
		}
	}
	if op == nil || op.State != "failed" || !strings.Contains(op.Reason, "reg*") {
		t.Errorf("upgrade operation: %+v", op)
	}
	// What pg_upgrade said is in the service's own log.
	s.waitLogs(svc.ServiceID, url.Values{"search": {"pg_upgrade: Checking for"}}, 1)
	s.waitLogs(svc.ServiceID, url.Values{"search": {"failed at pg_upgrade --check"}, "severities": {"ERROR"}}, 1)
}

// TestUpgrade_KilledMidway kills dbcloud (SIGKILL) as soon as the service
// itself is stopped for its upgrade, while pg_upgrade runs: after the
// restart the upgrade is undone from what is on disk and made again, and
// the service ends READY on 17 with its rows.
func TestUpgrade_KilledMidway(t *testing.T) {
	t.Parallel()
	requirePGVersion(t, 17)
	s := newServer(t)
	_, db := s.killMidUpgrade(t, "", "stop")
	db.Close(context.Background())
}

// killMidUpgrade makes a service on 15 with 5,000 rows, asks for its
// upgrade to 17 (IN_PLACE when method is ""), kills dbcloud (SIGKILL) as
// the upgrade's step named step begins and starts it again. The upgrade
// must end READY on 17 with every row; it returns the service and a
// session on it for the caller's own checks.
func (s *server) killMidUpgrade(t *testing.T, method, step string) (service, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	svc, pw := s.createOn(t, 15, nil)
	db := s.mustConnect(svc.service, pw)
	if _, err := db.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT i, md5(i::text) FROM generate_series(1, 5000) i`); err != nil {
		t.Fatal(err)
	}
	db.Close(ctx)
	evctx, cancel := context.WithTimeout(ctx, upgradeWithin)
	defer cancel()
	stream, closeStream := s.events(evctx, "0")
	body := map[string]any{"pg_version": 17}
	if method != "" {
		body["method"] = method
	}
	var accepted service
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/upgrade", body, &accepted); code != 202 {
		t.Fatalf("upgrade: %d %s", code, accepted.Message)
	}
	readUntil(t, stream, 0, func(e streamEvent) bool {
		return e.Type == "service.upgrade_step" && e.ResourceID == svc.ServiceID && e.Status == step
	})
	closeStream()
	s.kill()
	s.start()
	back := s.waitStatus(svc.ServiceID, "READY", upgradeWithin)
	var got versionedService
	if code := s.call("GET", s.services()+"/"+svc.ServiceID, nil, &got); code != 200 || got.Metadata.PGVersion != 17 || back.StatusReason != "" {
		t.Fatalf("after the restart: %d, metadata %+v, reason %q", code, got.Metadata, back.StatusReason)
	}
	db = s.mustConnect(back, pw)
	if v := queryValues(t, db, `SHOW server_version`); len(v) != 1 || !strings.HasPrefix(v[0], "17.") {
		t.Errorf("server_version %q, want 17", v)
	}
	if v := queryValues(t, db, `SELECT count(*)::text FROM t`); !slices.Equal(v, []string{"5000"}) {
		t.Errorf("rows after the interrupted upgrade: %q", v)
	}
	return back, db
}
