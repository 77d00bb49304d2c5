package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"dbcloud"
	"dbcloud/runtime/local/postgres"

	"github.com/jackc/pgx/v5"
)

// What a BLUE_GREEN upgrade does inside the clusters, in SQL and with the
// PostgreSQL programs, as dbcloud's superuser over the unix sockets.

// bgDB is a database the upgrade moves.
type bgDB struct {
	Name  string
	Owner string
}

// bgSubName names the subscription (and blue's slot) of the i-th database.
func bgSubName(i int) string { return bgName + "_" + strconv.Itoa(i) }

func randomPassword() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return fmt.Sprintf("%x", b), nil
}

// listDBs lists the databases a client can reach.
func (b *bgRun) listDBs(ctx context.Context, s postgres.Spec) ([]bgDB, error) {
	conn, err := b.rt.instances.Connect(ctx, s, "postgres")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return dbsOf(ctx, conn)
}

// dbsOf lists the databases a client can reach, in a session of dbcloud's.
func dbsOf(ctx context.Context, conn *pgx.Conn) ([]bgDB, error) {
	rows, err := conn.Query(ctx, "SELECT datname, pg_get_userbyid(datdba) FROM pg_database WHERE datallowconn AND NOT datistemplate ORDER BY datname")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[bgDB])
}

// refuseNewDatabases fails the switch when blue has databases green
// lacks: made during the copy (CREATE DATABASE fires no event trigger, so
// nothing refused it), they have no subscription, so the switch could
// never catch up on them, and green would serve without them.
func (b *bgRun) refuseNewDatabases(ctx context.Context, blue, green postgres.Spec) error {
	want, err := b.listDBs(ctx, blue)
	if err != nil {
		return err
	}
	return b.refuseMissing(ctx, want, green)
}

// refuseDatabasesMadeMeanwhile is refuseNewDatabases once blue's sessions
// are ended: a tenant's session could still create a database between the
// first check and its end, and caughtUp waits only for the databases
// openBlue listed, so green would lack it without a word. No tenant
// session is left now, so this list is final. It reads it in dbcloud's
// open session: a Direct blue's postmaster takes no new connection now.
func (b *bgRun) refuseDatabasesMadeMeanwhile(ctx context.Context, sessions *blueSessions, green postgres.Spec) error {
	want, err := dbsOf(ctx, sessions.conns["postgres"])
	if err != nil {
		return err
	}
	return b.refuseMissing(ctx, want, green)
}

// refuseMissing fails the switch, naming them, when green lacks databases
// of want.
func (b *bgRun) refuseMissing(ctx context.Context, want []bgDB, green postgres.Spec) error {
	have, err := b.listDBs(ctx, green)
	if err != nil {
		return err
	}
	var added []string
	for _, db := range want {
		if !slices.ContainsFunc(have, func(h bgDB) bool { return h.Name == db.Name }) {
			added = append(added, postgres.QuoteIdent(db.Name))
		}
	}
	if len(added) == 0 {
		return nil
	}
	return &dbcloud.UpgradeFailed{Step: "switch", Reason: fmt.Sprintf(
		"database %s was created after the upgrade's copy began, so the new cluster does not have it; upgrade again to include it",
		strings.Join(added, ", "))}
}

// execEach runs statements in one session of db, in order; replica makes
// the session's own DDL pass the upgrade's event trigger.
func (b *bgRun) execEach(ctx context.Context, s postgres.Spec, db string, replica bool, stmts ...string) error {
	var settings map[string]string
	if replica {
		settings = map[string]string{"session_replication_role": "replica"}
	}
	conn, err := b.rt.instances.ConnectWith(ctx, s, db, settings)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s in database %s of %s: %w", firstWords(q), db, s.ID, err)
		}
	}
	return nil
}

func firstWords(q string) string {
	f := strings.Fields(q)
	return strings.Join(f[:min(3, len(f))], " ")
}

// refuseTimescale fails the upgrade when any database has TimescaleDB:
// a hypertable's rows live in chunks, which logical replication carries
// as tables of their own, without the hypertable over them.
func (b *bgRun) refuseTimescale(ctx context.Context, blue postgres.Spec) error {
	dbs, err := b.listDBs(ctx, blue)
	if err != nil {
		return err
	}
	for _, db := range dbs {
		has, err := b.rt.queryStrings(ctx, blue, db.Name, "SELECT extname FROM pg_extension WHERE extname = 'timescaledb'")
		if err != nil {
			return err
		}
		if len(has) > 0 {
			return &dbcloud.UpgradeFailed{Step: "check", Reason: "database " + db.Name +
				" has the extension timescaledb: hypertables do not replicate logically, so BLUE_GREEN cannot move them; upgrade with IN_PLACE"}
		}
	}
	return nil
}

// prepareBlue makes in blue what the copy needs: the replication role,
// and in every database the DDL refusal, a publication of all tables, and
// REPLICA IDENTITY FULL on tables without a key (recorded in st).
func (b *bgRun) prepareBlue(ctx context.Context, blue postgres.Spec, st *bgState) ([]bgDB, error) {
	dbs, err := b.listDBs(ctx, blue)
	if err != nil {
		return nil, err
	}
	if err := b.execEach(ctx, blue, "postgres", true,
		"DROP ROLE IF EXISTS "+bgName,
		"CREATE ROLE "+bgName+" LOGIN REPLICATION PASSWORD "+postgres.QuoteLiteral(st.Password),
		"GRANT pg_read_all_data TO "+bgName); err != nil {
		return nil, err
	}
	refuse := fmt.Sprintf(`CREATE FUNCTION %[1]s.refuse_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $f$
BEGIN
	RAISE EXCEPTION 'The service is being upgraded to PostgreSQL %[2]d (BLUE_GREEN): schema changes are refused until it has switched.'
		USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Try again once the service is READY.';
END $f$`, bgName, b.to.Major)
	st.FullIdentity = map[string][]string{}
	for _, db := range dbs {
		if err := b.execEach(ctx, blue, db.Name, true,
			"CREATE SCHEMA "+bgName,
			refuse,
			"CREATE EVENT TRIGGER "+bgName+"_ddl ON ddl_command_start EXECUTE FUNCTION "+bgName+".refuse_ddl()"); err != nil {
			return nil, err
		}
		keyless, err := b.rt.queryStrings(ctx, blue, db.Name, `SELECT format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND c.relreplident = 'd'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_toast%'
  AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)`)
		if err != nil {
			return nil, err
		}
		stmts := []string{}
		for _, t := range keyless {
			stmts = append(stmts, "ALTER TABLE "+t+" REPLICA IDENTITY FULL")
		}
		st.FullIdentity[db.Name] = keyless
		stmts = append(stmts, "CREATE PUBLICATION "+bgName+" FOR ALL TABLES")
		if err := b.execEach(ctx, blue, db.Name, true, stmts...); err != nil {
			return nil, err
		}
	}
	return dbs, nil
}

// pipe runs dump (a program of the target version's) into psql on green,
// both as dbcloud's own user, which peer authentication maps to the
// superuser. strict stops psql at the first error; otherwise errors are
// only logged (the roles that green has already).
func (b *bgRun) pipe(ctx context.Context, dump []string, green postgres.Spec, db string, strict bool) error {
	bin := b.rt.binDirs[b.to.Major]
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", "LC_ALL=C", "PGCONNECT_TIMEOUT=10"}
	d := exec.CommandContext(ctx, filepath.Join(bin, dump[0]), dump[1:]...)
	onErr := "0"
	if strict {
		onErr = "1"
	}
	l := exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP="+onErr,
		"-h", green.RunDir(), "-p", strconv.Itoa(green.Port), "-U", "postgres", "-d", db)
	d.Env, l.Env = env, env
	var dErr, lOut bytes.Buffer
	d.Stderr, l.Stdout, l.Stderr = &dErr, &lOut, &lOut
	r, err := d.StdoutPipe()
	if err != nil {
		return err
	}
	l.Stdin = r
	if err := d.Start(); err != nil {
		return err
	}
	lerr := l.Run()
	derr := d.Wait()
	if derr != nil {
		return fmt.Errorf("%s: %w: %s", dump[0], derr, lastLines(dErr.String(), 10))
	}
	if lerr != nil {
		return &dbcloud.UpgradeFailed{Step: "schema", Reason: "the schema of database " + db + " did not load into PostgreSQL " +
			strconv.Itoa(b.to.Major) + ": " + lastLines(lOut.String(), 3)}
	}
	if out := strings.TrimSpace(lOut.String()); out != "" {
		b.rt.cfg.Logger.Info("blue/green upgrade: psql said", "service", b.svc.ID, "database", db, "output", lastLines(out, 20))
	}
	return nil
}

// copySchema copies the roles (with their password verifiers), makes the
// databases green lacks, and loads each database's schema.
func (b *bgRun) copySchema(ctx context.Context, blue, green postgres.Spec, dbs []bgDB) error {
	src := []string{"-h", blue.RunDir(), "-p", strconv.Itoa(blue.Port), "-U", "postgres"}
	if err := b.pipe(ctx, append([]string{"pg_dumpall", "--roles-only"}, src...), green, "postgres", false); err != nil {
		return err
	}
	have, err := b.listDBs(ctx, green)
	if err != nil {
		return err
	}
	for _, db := range dbs {
		found := false
		for _, h := range have {
			found = found || h.Name == db.Name
		}
		if !found {
			if err := b.execEach(ctx, green, "postgres", false, "CREATE DATABASE "+postgres.QuoteIdent(db.Name)+" OWNER "+postgres.QuoteIdent(db.Owner)); err != nil {
				return err
			}
		}
		dump := append([]string{"pg_dump", "--schema-only", "--no-publications", "--no-subscriptions", "-d", db.Name}, src...)
		if err := b.pipe(ctx, dump, green, db.Name, true); err != nil {
			return err
		}
		// The dump carried blue's DDL refusal; green takes changes.
		if err := b.execEach(ctx, green, db.Name, false,
			"DROP EVENT TRIGGER IF EXISTS "+bgName+"_ddl", "DROP SCHEMA IF EXISTS "+bgName+" CASCADE"); err != nil {
			return err
		}
	}
	return nil
}

// subscribe makes in every database of green a subscription to blue's
// publication, which copies every table and then streams.
func (b *bgRun) subscribe(ctx context.Context, blue, green postgres.Spec, st *bgState, dbs []bgDB) error {
	for i, db := range dbs {
		conninfo := fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=%s", postgres.QuoteDSN(blue.RunDir()), blue.Port,
			postgres.QuoteDSN(db.Name), bgName, postgres.QuoteDSN(st.Password))
		if err := b.execEach(ctx, green, db.Name, false, "CREATE SUBSCRIPTION "+bgSubName(i)+" CONNECTION "+postgres.QuoteLiteral(conninfo)+
			" PUBLICATION "+bgName+" WITH (copy_data = true)"); err != nil {
			return err
		}
	}
	return nil
}

// waitCopied polls green until every table of every subscription is
// copied and each apply worker runs.
func (b *bgRun) waitCopied(ctx context.Context, green postgres.Spec, dbs []bgDB) error {
	deadline := time.Now().Add(bgCopyLimit)
	for i, db := range dbs {
		for {
			out, err := b.rt.queryStrings(ctx, green, db.Name, `SELECT (SELECT count(*) FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
	WHERE s.subname = '`+bgSubName(i)+`' AND r.srsubstate NOT IN ('r', 's'))::text
	|| ' ' || (SELECT count(*) FROM pg_stat_subscription WHERE subname = '`+bgSubName(i)+`' AND pid IS NOT NULL AND relid IS NULL)::text`)
			if err != nil {
				return err
			}
			if len(out) == 1 && out[0] == "0 1" {
				break
			}
			if time.Now().After(deadline) {
				return &dbcloud.UpgradeFailed{Step: "copy", Reason: "the initial copy of database " + db.Name + " did not finish within " + bgCopyLimit.String()}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// caughtUp waits until every subscription has applied blue's WAL up to
// its position once the sessions are gone, and returns that position.
func (b *bgRun) caughtUp(ctx context.Context, blue *blueSessions) (string, error) {
	conn, dbs := blue.conns["postgres"], blue.dbs
	// The WAL inserted, not only written: a commit with synchronous_commit
	// off is acknowledged once its record is inserted, and the walsenders
	// send only what is flushed, which the walwriter (a held postmaster
	// does not stop it) does within wal_writer_delay. Green has every
	// acknowledged commit once it has applied this far.
	var lsn string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		return "", err
	}
	deadline := time.Now().Add(bgCatchUp)
	for {
		var n int
		var done bool
		err := conn.QueryRow(ctx, `SELECT count(*), coalesce(bool_and(replay_lsn >= $1::pg_lsn), false)
FROM pg_stat_replication WHERE application_name LIKE 'dbcloud\_upgrade\_%'`, lsn).Scan(&n, &done)
		if err != nil {
			return "", err
		}
		if done && n >= len(dbs) {
			return lsn, nil
		}
		if time.Now().After(deadline) {
			return "", &dbcloud.UpgradeFailed{Step: "switch", Reason: fmt.Sprintf("the new cluster did not apply the last writes within %v", bgCatchUp)}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// copySequences sets every sequence of green to blue's value, and then
// commits once on green with a synchronous commit, which flushes all that
// green applied before it.
func (b *bgRun) copySequences(ctx context.Context, blue *blueSessions, green postgres.Spec) (int, error) {
	n := 0
	for _, db := range blue.dbs {
		if blue.conns[db.Name] == nil {
			continue // no sequences (openBlue)
		}
		vals, err := blue.strings(ctx, db.Name, "SELECT format('%I.%I', schemaname, sequencename) || ' ' || last_value FROM pg_sequences WHERE last_value IS NOT NULL")
		if err != nil {
			return n, err
		}
		if len(vals) == 0 {
			continue
		}
		conn, err := b.rt.instances.Connect(ctx, green, db.Name)
		if err != nil {
			return n, err
		}
		batch := &pgx.Batch{}
		for _, v := range vals {
			i := strings.LastIndexByte(v, ' ')
			batch.Queue("SELECT pg_catalog.setval($1::regclass, $2::bigint, true)", v[:i], v[i+1:])
		}
		err = conn.SendBatch(ctx, batch).Close()
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return n, err
		}
		n += len(vals)
	}
	return n, b.execEach(ctx, green, "postgres", false, "SELECT pg_current_xact_id()")
}

// copyPasswords sets every role's password verifier on green to blue's:
// a password changed during the copy (ALTER ROLE is no DDL an event
// trigger sees) is the one that works after the switch.
func (b *bgRun) copyPasswords(ctx context.Context, blue *blueSessions, green postgres.Spec) (int, error) {
	stmts, err := blue.strings(ctx, "postgres", `SELECT format('DO $x$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = %L) THEN ALTER ROLE %I PASSWORD %L; END IF; END $x$',
	rolname, rolname, rolpassword) FROM pg_authid WHERE rolpassword IS NOT NULL AND rolname <> '`+bgName+`'`)
	if err != nil {
		return 0, err
	}
	return len(stmts), b.execEach(ctx, green, "postgres", false, stmts...)
}

// cleanGreen drops the subscriptions, leaving blue's slots to cleanBlue
// (blue may be stopped by then).
func (b *bgRun) cleanGreen(ctx context.Context, green postgres.Spec) error {
	conn, err := b.rt.instances.Connect(ctx, green, "postgres")
	if err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `SELECT s.subname::text, d.datname::text FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid
WHERE s.subname LIKE 'dbcloud\_upgrade\_%'`)
	var subs [][2]string
	if err == nil {
		subs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
			var v [2]string
			return v, r.Scan(&v[0], &v[1])
		})
	}
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	for _, s := range subs {
		if err := b.execEach(ctx, green, s[1], false, "ALTER SUBSCRIPTION "+s[0]+" DISABLE",
			"ALTER SUBSCRIPTION "+s[0]+" SET (slot_name = NONE)", "DROP SUBSCRIPTION "+s[0]); err != nil {
			return err
		}
	}
	return b.execEach(ctx, green, "postgres", false, "DROP ROLE IF EXISTS "+bgName)
}

// cleanBlue removes from blue what prepareBlue made: the publications,
// the DDL refusal, the replica identities it changed, the slots (once no
// subscription streams from them) and the role.
func (b *bgRun) cleanBlue(ctx context.Context, blue postgres.Spec, st *bgState) error {
	// Left by a switch cut short between its writing and its removal; the
	// seal, by a switch made (blue is kept sealed by its pg_hba.conf
	// then), would refuse every login after a ROLLBACK.
	if err := postgres.RemoveSwitchFiles(blue.PGData()); err != nil {
		return err
	}
	dbs, err := b.listDBs(ctx, blue)
	if err != nil {
		return err
	}
	for _, db := range dbs {
		stmts := []string{"DROP EVENT TRIGGER IF EXISTS " + bgName + "_ddl", "DROP SCHEMA IF EXISTS " + bgName + " CASCADE",
			"DROP PUBLICATION IF EXISTS " + bgName}
		for _, t := range st.FullIdentity[db.Name] {
			stmts = append(stmts, "ALTER TABLE IF EXISTS "+t+" REPLICA IDENTITY DEFAULT")
		}
		if err := b.execEach(ctx, blue, db.Name, true, stmts...); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, err := b.rt.queryStrings(ctx, blue, "postgres", `SELECT slot_name::text FROM pg_replication_slots WHERE slot_name LIKE 'dbcloud\_upgrade\_%'`)
		if err != nil {
			return err
		}
		if len(left) == 0 {
			break
		}
		if _, err := b.rt.queryStrings(ctx, blue, "postgres", `SELECT pg_drop_replication_slot(slot_name)::text FROM pg_replication_slots
WHERE slot_name LIKE 'dbcloud\_upgrade\_%' AND NOT active`); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replication slots %v of %s are still in use", left, blue.ID)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return b.execEach(ctx, blue, "postgres", false, "DROP ROLE IF EXISTS "+bgName)
}
