package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestUpgrade_BlueGreen upgrades a PostgreSQL 15 service to 17 by
// BLUE_GREEN (decisions.md section 11) under a writer committing one row
// at a time through the endpoint: the 15 service writes logical WAL from
// its creation, so the old primary serves without a restart until the
// switch (the same postmaster, the writer's session untouched, through
// the copy); every acknowledged row is on the new cluster, which says 17
// on the same host and port; the writer's session at the switch was
// ended with an error saying why (57P01, "switching to PostgreSQL 17"), and its new connections then
// were held, not refused by the old primary; the old
// passwords work; a table without a key kept its rows; a schema change
// during the copy is refused naming the upgrade; every step is in the
// event stream. Then ROLLBACK returns to 15 with the rows from before the
// switch and without what was written after it, a second ROLLBACK is
// refused, and a second BLUE_GREEN upgrade, of the service now behind its
// endpoint proxy, ends on 17 with the rows.
func TestUpgrade_BlueGreen(t *testing.T) {
	t.Parallel()
	requirePGVersion(t, 17)
	s := newServer(t)
	ctx := context.Background()
	svc, pw := s.createOn(t, 15, nil)
	db := s.mustConnect(svc.service, pw)
	if _, err := db.Exec(ctx, `CREATE TABLE w (id bigserial PRIMARY KEY, n bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE keyless (v int);
		CREATE SEQUENCE counter;
		SELECT nextval('counter') FROM generate_series(1, 5);
		INSERT INTO keyless SELECT generate_series(1, 100);
		CREATE ROLE app LOGIN PASSWORD 'app-secret-1'`); err != nil {
		t.Fatal(err)
	}
	if v := queryValues(t, db, `SHOW wal_level`); !slices.Equal(v, []string{"logical"}) {
		t.Errorf("wal_level of a new 15 service on a host with 17: %q, want logical (the upgrade would restart it)", v)
	}
	started := queryValues(t, db, `SELECT pg_postmaster_start_time()::text`)
	db.Close(ctx)
	w := s.startWriterInto(svc.service, pw, 1, false, "INSERT INTO w (n) VALUES ($1)")
	defer w.halt()
	w.commitAfter(t, time.Now())

	evctx, cancel := context.WithTimeout(ctx, upgradeWithin)
	defer cancel()
	stream, closeStream := s.events(evctx, "0")
	defer closeStream()
	var accepted service
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/upgrade", map[string]any{"pg_version": 17, "method": "BLUE_GREEN"}, &accepted); code != 202 || accepted.Status != "UPGRADING" {
		t.Fatalf("upgrade: %d %s %s", code, accepted.Status, accepted.Message)
	}
	// A schema change once the schema is copied, before the switch, is
	// refused on 15; one that lands after the switch is on 17.
	var steps []string
	stepAt := map[string]time.Time{}
	seen := readUntil(t, stream, 0, func(e streamEvent) bool {
		if e.Type == "service.upgrade_step" && e.ResourceID == svc.ServiceID {
			steps = append(steps, e.Status)
		}
		return e.Type == "service.upgrade_step" && e.ResourceID == svc.ServiceID && e.Status == "schema"
	})
	if ddl, err := s.connect(ctx, svc.service, pw); err != nil {
		t.Errorf("connect during the copy: %v", err)
	} else {
		// A password changed during the copy is the one that works after.
		if _, err := ddl.Exec(ctx, "ALTER ROLE app PASSWORD 'app-secret-2'"); err != nil {
			t.Errorf("a password change during the copy: %v", err)
		}
		// The old primary has not restarted: no pause before the switch.
		if v := queryValues(t, ddl, `SELECT pg_postmaster_start_time()::text`); !slices.Equal(v, started) {
			t.Errorf("the old primary restarted before the copy: started %q, was %q", v, started)
		}
		var version string
		_, err := ddl.Exec(ctx, "CREATE TABLE during_copy (v int)")
		ddl.QueryRow(ctx, "SHOW server_version").Scan(&version)
		ddl.Close(ctx)
		switch {
		case err != nil && !strings.Contains(err.Error(), "being upgraded to PostgreSQL 17"):
			t.Errorf("DDL during the copy: %v, want a refusal naming the upgrade", err)
		case err == nil && strings.HasPrefix(version, "15."):
			t.Errorf("DDL during the copy was accepted on %s", version)
		case err == nil:
			t.Logf("the DDL came after the switch (%s)", version)
		}
	}
	back := s.waitStatus(svc.ServiceID, "READY", upgradeWithin)
	ready := time.Now()
	w.commitAfter(t, ready)
	readUntil(t, stream, seen[len(seen)-1].ID, func(e streamEvent) bool {
		if e.Type == "service.upgrade_step" && e.ResourceID == svc.ServiceID {
			steps = append(steps, e.Status)
			stepAt[e.Status] = e.Time
		}
		return e.Type == "operation.finished" && e.ResourceID == svc.ServiceID
	})
	acked := w.halt()
	t.Logf("%d rows acknowledged; longest gap between commits %v; steps %q", len(acked), longestGap(acked, time.Time{}, time.Time{}).Round(time.Millisecond), steps)

	var got versionedService
	if code := s.call("GET", s.services()+"/"+svc.ServiceID, nil, &got); code != 200 || got.Metadata.PGVersion != 17 || back.StatusReason != "" {
		t.Fatalf("after the upgrade: %d, metadata %+v, reason %q", code, got.Metadata, back.StatusReason)
	}
	if got.Endpoint != svc.Endpoint {
		t.Errorf("endpoint moved: %+v, was %+v", got.Endpoint, svc.Endpoint)
	}
	db = s.mustConnect(got.service, pw)
	if v := queryValues(t, db, `SHOW server_version`); len(v) != 1 || !strings.HasPrefix(v[0], "17.") {
		t.Errorf("server_version %q after the upgrade, want 17", v)
	}
	have := map[int]bool{}
	for _, v := range queryValues(t, db, `SELECT n::text FROM w`) {
		n, _ := strconv.Atoi(v)
		have[n] = true
	}
	missing := 0
	for _, a := range acked {
		if !have[a.id] {
			missing++
		}
	}
	if missing > 0 || len(acked) == 0 {
		t.Errorf("%d of %d acknowledged rows missing on 17", missing, len(acked))
	}
	if v := queryValues(t, db, `SELECT count(*)::text FROM keyless`); !slices.Equal(v, []string{"100"}) {
		t.Errorf("rows of the table without a key on 17: %q", v)
	}
	if v := queryValues(t, db, `SELECT nextval('counter')::text`); !slices.Equal(v, []string{"6"}) {
		t.Errorf("a sequence's next value on 17: %q, want 6 (copied at the switch)", v)
	}
	if _, err := db.Exec(ctx, "INSERT INTO w (n) VALUES (-1)"); err != nil {
		t.Errorf("a write on 17: %v", err)
	}
	db.Close(ctx)
	appDSN := strings.Replace(s.dsn(got.service, "app-secret-2"), "tsdbadmin:", "app:", 1)
	if c, err := pgx.Connect(ctx, appDSN); err != nil {
		t.Errorf("the extra role's password, changed during the copy, on 17: %v", err)
	} else {
		c.Close(ctx)
	}
	// The session open at the switch (after the copy, before the
	// endpoint moved) was ended by the server, with a reason.
	sawSwitch, duplicates := false, 0
	var ended []string
	endedBy, refusedBy := w.serverErrors()
	for _, e := range endedBy {
		if e.err.Code == "23505" {
			duplicates++
			continue
		}
		ended = append(ended, e.at.Format("15:04:05.000")+" "+e.err.Severity+" "+e.err.Code+" "+e.err.Message)
		if e.at.Before(stepAt["copy"]) {
			t.Errorf("the writer's session was ended before the copy had finished (%s): %s %s %s",
				stepAt["copy"].Format("15:04:05.000"), e.err.Severity, e.err.Code, e.err.Message)
		}
		sawSwitch = sawSwitch || (e.err.Code == "57P01" && e.err.Severity == "FATAL" && strings.Contains(e.err.Message, "switching to PostgreSQL 17") &&
			e.at.After(stepAt["copy"]) && e.at.Before(stepAt["switch"]))
	}
	if duplicates > 0 {
		t.Errorf("the writer hit a duplicate key %d times (a sequence behind its table)", duplicates)
	}
	// New connections at the switch wait (in the old primary's listen
	// queue) rather than being refused by it.
	for _, e := range refusedBy {
		if e.err.Code == "28000" {
			t.Errorf("a connection at %s was refused by the old primary: %s %s %s (want it held until the switch)",
				e.at.Format("15:04:05.000"), e.err.Severity, e.err.Code, e.err.Message)
			break
		}
	}
	if !sawSwitch {
		t.Errorf("the writer's session at the switch (%s to %s) was not ended with FATAL 57P01 saying it is switching to PostgreSQL 17; sessions ended by %q",
			stepAt["copy"].Format("15:04:05.000"), stepAt["switch"].Format("15:04:05.000"), ended)
	}
	for _, want := range []string{"new_cluster", "schema", "copy", "caught_up", "switch", "kept"} {
		if !slices.Contains(steps, want) {
			t.Errorf("step %s missing from the upgrade's events %q", want, steps)
		}
	}

	// ROLLBACK: back to 15 as it was at the switch.
	var rolling service
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/upgrade", map[string]any{"pg_version": 15, "method": "ROLLBACK"}, &rolling); code != 202 ||
		!strings.Contains(rolling.StatusReason, "lost") {
		t.Fatalf("rollback: %d %s %q", code, rolling.Message, rolling.StatusReason)
	}
	back = s.waitStatus(svc.ServiceID, "READY", upgradeWithin)
	if code := s.call("GET", s.services()+"/"+svc.ServiceID, nil, &got); code != 200 || got.Metadata.PGVersion != 15 || back.StatusReason != "" {
		t.Fatalf("after the rollback: %d, metadata %+v, reason %q", code, got.Metadata, back.StatusReason)
	}
	db = s.mustConnect(got.service, pw)
	if v := queryValues(t, db, `SHOW server_version`); len(v) != 1 || !strings.HasPrefix(v[0], "15.") {
		t.Errorf("server_version %q after the rollback, want 15", v)
	}
	if v := queryValues(t, db, `SELECT count(*)::text FROM w WHERE n = -1`); !slices.Equal(v, []string{"0"}) {
		t.Errorf("the row written after the switch is on 15 after the rollback: %q", v)
	}
	rows := queryValues(t, db, `SELECT count(*)::text FROM w WHERE n > 0`)
	if len(rows) != 1 || rows[0] == "0" {
		t.Errorf("rows from before the switch after the rollback: %q", rows)
	}
	if _, err := db.Exec(ctx, "CREATE TABLE after_rollback (v int)"); err != nil {
		t.Errorf("DDL after the rollback (the upgrade's trigger gone): %v", err)
	}
	db.Close(ctx)
	var again service
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/upgrade", map[string]any{"pg_version": 15, "method": "ROLLBACK"}, &again); code != 409 ||
		!strings.Contains(again.Message, "no old cluster") {
		t.Errorf("a second rollback: %d %s", code, again.Message)
	}

	// Back on 15 the service is behind its endpoint proxy (the layout the
	// switch left): BLUE_GREEN again holds new connections at the proxy,
	// and ends on 17 with the rows.
	var second service
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/upgrade", map[string]any{"pg_version": 17, "method": "BLUE_GREEN"}, &second); code != 202 {
		t.Fatalf("a second BLUE_GREEN upgrade: %d %s", code, second.Message)
	}
	back = s.waitStatus(svc.ServiceID, "READY", upgradeWithin)
	if code := s.call("GET", s.services()+"/"+svc.ServiceID, nil, &got); code != 200 || got.Metadata.PGVersion != 17 || back.StatusReason != "" {
		t.Fatalf("after a second BLUE_GREEN upgrade: %d, metadata %+v, reason %q", code, got.Metadata, back.StatusReason)
	}
	db = s.mustConnect(got.service, pw)
	defer db.Close(ctx)
	if v := queryValues(t, db, `SELECT count(*)::text FROM w WHERE n > 0`); !slices.Equal(v, rows) {
		t.Errorf("rows after a second BLUE_GREEN upgrade: %q, want %q", v, rows)
	}
	if v := queryValues(t, db, `SELECT count(*)::text FROM after_rollback`); !slices.Equal(v, []string{"0"}) {
		t.Errorf("the table made after the rollback, after a second upgrade: %q", v)
	}
}

// TestUpgrade_BlueGreenKilledMidway kills dbcloud (SIGKILL) during a
// BLUE_GREEN upgrade of a service whose primary listens on the endpoint
// itself, and restarts it. Killed once the new cluster has its schema (as
// its subscriptions are made), before the commit point: the attempt is
// undone from bluegreen.json (the new cluster removed, the old one
// cleaned) and made again. Killed once the new cluster has every commit
// (the commit point written: the old primary may be left stopped with
// SIGSTOP, its clients held): the switch is finished. Either way the
// service ends READY on 17 with its rows, its DDL no longer refused.
func TestUpgrade_BlueGreenKilledMidway(t *testing.T) {
	t.Parallel()
	requirePGVersion(t, 17)
	for _, at := range []string{"schema", "caught_up"} {
		t.Run(at, func(t *testing.T) { killBlueGreenAt(t, at) })
	}
}

// killBlueGreenAt upgrades a service by BLUE_GREEN, kills dbcloud when
// the upgrade's step at is in the event stream, restarts it, and checks
// the service ends upgraded.
func killBlueGreenAt(t *testing.T, at string) {
	s := newServer(t)
	ctx := context.Background()
	svc, db := s.killMidUpgrade(t, "BLUE_GREEN", at)
	defer db.Close(ctx)
	if _, err := db.Exec(ctx, "CREATE TABLE after_upgrade (v int)"); err != nil {
		t.Errorf("DDL after the upgrade: %v", err)
	}
	// The interrupted attempt's new cluster is gone: the service has the
	// kept old cluster and the one it runs on, no third.
	localOnly(t, "reads the service's instance directories on this host")
	entries, err := os.ReadDir(filepath.Join(s.runtimeDir(), "services", svc.ServiceID))
	if err != nil {
		t.Fatal(err)
	}
	var instances []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil && e.IsDir() {
			instances = append(instances, e.Name())
		}
	}
	if len(instances) != 2 {
		t.Errorf("instance directories %q after the interrupted upgrade, want the kept one and the new one", instances)
	}
}
