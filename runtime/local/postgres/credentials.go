package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud/runtime/local/internal/proc"
)

// Database credentials (decisions.md section 12) are login roles dbcloud
// makes on a service's primary, named CredentialPrefix + the credential's
// ID. The guard reserves every dbcloud_* name, so the tenant can neither
// make such a role nor change, grant or drop one; only dbcloud's superuser
// does, here.
//
// Both kinds are members of tsdbadmin (INHERIT), so they reach exactly what
// the tenant's own login reaches, in every database, and a table tsdbadmin
// makes later is readable at once. A READ_ONLY one has the guard's
// tsdb_admin.read_only_role, as the original CLI's read-only roles have:
// its sessions are latched read-only at their first statement, whatever
// they set or whose role they take. Not pg_read_all_data: that reads every
// table of the instance, pg_authid's password hashes included, and the
// guard (and RevokeReservedMemberships) refuse it to anything but the
// superuser.
const CredentialPrefix = "dbcloud_cred_"

// TenantRole is the service's own login, whose privileges credentials act
// with and to which what a dropped credential owned passes.
const TenantRole = "tsdbadmin"

// credentialName is what a credential role's name must be: the prefix and
// an ID of [a-z0-9] (dbcloud.NewID), so it never needs case folding.
var credentialName = regexp.MustCompile(`^dbcloud_cred_[a-z0-9]{1,50}$`)

// readOnlySetting is how ALTER ROLE stores the guard's read-only setting.
const readOnlySetting = "tsdb_admin.read_only_role=on"

// CredentialRole is one credential role as it must be.
type CredentialRole struct {
	Name     string
	Verifier string // SCRAM-SHA-256 verifier, never a password
	ReadOnly bool
	Expires  time.Time
}

// Validate refuses a role that SyncCredentials could not keep: a name
// outside the prefix would never be dropped, a password that is not a
// verifier would reach PostgreSQL's logs.
func (c CredentialRole) Validate() error {
	if !credentialName.MatchString(c.Name) {
		return fmt.Errorf("credential role %q is not %s followed by an ID", c.Name, CredentialPrefix)
	}
	if !strings.HasPrefix(c.Verifier, "SCRAM-SHA-256$") || strings.ContainsAny(c.Verifier, "'\\\n") {
		return fmt.Errorf("credential role %s: the password is not a SCRAM-SHA-256 verifier", c.Name)
	}
	if c.Expires.IsZero() {
		return fmt.Errorf("credential role %s has no expiry", c.Name)
	}
	return nil
}

// credentialState is a credential role as the catalog has it.
type credentialState struct {
	name       string
	verifier   string
	validUntil *time.Time
	// plain: LOGIN, INHERIT, no other attribute, no connection limit.
	plain    bool
	canLogin bool
	settings []string
	memberOf []string // roles it is a member of; tsdbadmin only, without ADMIN
	admin    bool     // it holds ADMIN OPTION on one of them
	members  []string // roles that are members of it: none
}

const credentialStateSQL = `
SELECT a.rolname::text, COALESCE(a.rolpassword, ''),
	CASE WHEN pg_catalog.isfinite(a.rolvaliduntil) THEN a.rolvaliduntil END,
	a.rolcanlogin AND a.rolinherit AND NOT a.rolsuper AND NOT a.rolcreaterole AND NOT a.rolcreatedb
		AND NOT a.rolreplication AND NOT a.rolbypassrls AND a.rolconnlimit = -1,
	a.rolcanlogin,
	COALESCE((SELECT s.setconfig FROM pg_catalog.pg_db_role_setting s WHERE s.setrole = a.oid AND s.setdatabase = 0), '{}')::text[],
	ARRAY(SELECT r.rolname::text FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_authid r ON r.oid = m.roleid
		WHERE m.member = a.oid ORDER BY 1),
	EXISTS (SELECT FROM pg_catalog.pg_auth_members m WHERE m.member = a.oid AND m.admin_option),
	ARRAY(SELECT r.rolname::text FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_authid r ON r.oid = m.member
		WHERE m.roleid = a.oid ORDER BY 1)
FROM pg_catalog.pg_authid a
WHERE a.rolname LIKE 'dbcloud\_cred\_%'
ORDER BY 1`

// credentialStates reads every credential role of the instance.
func credentialStates(ctx context.Context, conn *pgx.Conn) (map[string]credentialState, error) {
	rows, err := conn.Query(ctx, credentialStateSQL)
	if err != nil {
		return nil, fmt.Errorf("read credential roles: %w", err)
	}
	out := map[string]credentialState{}
	for rows.Next() {
		var s credentialState
		if err := rows.Scan(&s.name, &s.verifier, &s.validUntil, &s.plain, &s.canLogin, &s.settings,
			&s.memberOf, &s.admin, &s.members); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read credential roles: %w", err)
		}
		out[s.name] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read credential roles: %w", err)
	}
	return out, nil
}

// CredentialChange is what ApplyCredentials did to one instance.
type CredentialChange struct {
	// Stale are the credential roles not wanted: made unable to log in,
	// their sessions still to be ended everywhere, then dropped.
	Stale []string
	// Reshaped are wanted roles whose access changed: their open sessions
	// were opened with the old access and must end.
	Reshaped []string
	// LSN is the primary's WAL position after the changes: a standby that
	// has replayed it lets none of the stale roles log in.
	LSN string
}

// ApplyCredentials, on a superuser session of the primary, makes each
// wanted role exist as it must (writing only what differs, so a round
// with nothing to change writes nothing) and every other credential role
// NOLOGIN. Its commits are local: a synchronous standby that is down
// must not hold a revocation up (the caller waits for the standbys it
// reaches). A wanted role it fails to make is an error returned with the
// change, which still holds the stale roles to end and drop.
func ApplyCredentials(ctx context.Context, conn *pgx.Conn, want []CredentialRole) (*CredentialChange, error) {
	for _, c := range want {
		if err := c.Validate(); err != nil {
			return nil, err
		}
	}
	// A failed statement is not written to the server log, which the
	// tenant reads: it would carry the verifier.
	if _, err := conn.Exec(ctx, "SET synchronous_commit = local; SET log_min_error_statement = panic"); err != nil {
		return nil, err
	}
	have, err := credentialStates(ctx, conn)
	if err != nil {
		return nil, err
	}
	change := &CredentialChange{}
	wanted := map[string]bool{}
	for _, c := range want {
		wanted[c.Name] = true
	}
	// Revocations first: a role that fails to be made must not hold them up.
	for name, cur := range have {
		if wanted[name] {
			continue
		}
		change.Stale = append(change.Stale, name)
		if cur.canLogin {
			if _, err := conn.Exec(ctx, "ALTER ROLE "+QuoteIdent(name)+" NOLOGIN"); err != nil {
				return nil, fmt.Errorf("credential role %s: %w", name, err)
			}
		}
	}
	var errs []error
	for _, c := range want {
		cur, exists := have[c.Name]
		stmts := credentialStatements(c, cur, exists)
		if len(stmts) == 0 {
			continue
		}
		if err := execTx(ctx, conn, stmts); err != nil {
			errs = append(errs, fmt.Errorf("credential role %s: %w", c.Name, err))
			continue
		}
		if exists && cur.readOnly() != c.ReadOnly {
			change.Reshaped = append(change.Reshaped, c.Name)
		}
	}
	slices.Sort(change.Stale)
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_current_wal_lsn()::text").Scan(&change.LSN); err != nil {
		return nil, err
	}
	return change, errors.Join(errs...)
}

func (s credentialState) readOnly() bool { return slices.Contains(s.settings, readOnlySetting) }

// credentialStatements are what makes cur (absent unless exists) the
// role c; none when it already is.
func credentialStatements(c CredentialRole, cur credentialState, exists bool) []string {
	role := QuoteIdent(c.Name)
	expires := c.Expires.UTC().Truncate(time.Microsecond)
	var stmts []string
	if !exists {
		stmts = append(stmts, "CREATE ROLE "+role)
	}
	if !exists || !cur.plain || cur.verifier != c.Verifier || cur.validUntil == nil || !cur.validUntil.Equal(expires) {
		stmts = append(stmts, "ALTER ROLE "+role+" LOGIN INHERIT NOSUPERUSER NOCREATEROLE NOCREATEDB NOREPLICATION NOBYPASSRLS"+
			" CONNECTION LIMIT -1 PASSWORD "+QuoteLiteral(c.Verifier)+
			" VALID UNTIL "+QuoteLiteral(expires.Format("2006-01-02 15:04:05.999999Z07:00")))
	}
	wantSettings := []string{}
	if c.ReadOnly {
		wantSettings = []string{readOnlySetting}
	}
	if !slices.Equal(cur.settings, wantSettings) && (exists || c.ReadOnly) {
		stmts = append(stmts, "ALTER ROLE "+role+" RESET ALL")
		if c.ReadOnly {
			stmts = append(stmts, "ALTER ROLE "+role+" SET tsdb_admin.read_only_role = on")
		}
	}
	// Members first: tsdbadmin made a member of the role (by a superuser)
	// would make granting tsdbadmin to it circular.
	for _, m := range cur.members {
		stmts = append(stmts, "REVOKE "+role+" FROM "+QuoteIdent(m))
	}
	for _, r := range cur.memberOf {
		if r != TenantRole {
			stmts = append(stmts, "REVOKE "+QuoteIdent(r)+" FROM "+role)
		}
	}
	if cur.admin && slices.Contains(cur.memberOf, TenantRole) {
		stmts = append(stmts, "REVOKE ADMIN OPTION FOR "+TenantRole+" FROM "+role)
	}
	if !slices.Contains(cur.memberOf, TenantRole) {
		stmts = append(stmts, "GRANT "+TenantRole+" TO "+role)
	}
	return stmts
}

// execTx runs stmts in one transaction: a role is never left half made.
func execTx(ctx context.Context, conn *pgx.Conn, stmts []string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// terminateWait is how long pg_terminate_backend waits for each session
// to be gone.
const terminateWaitMillis = 5000

// EndCredentialSessions ends, on one instance (primary or standby), every
// session logged in as one of names, and waits until they are gone. On a
// standby, first it waits until the instance has replayed lsn (the
// primary's NOLOGIN of those roles), so no session can log in after; a
// standby that has not replayed it within StreamingWait still has its
// sessions ended, and the error says so (the caller retries).
func (m *Instances) EndCredentialSessions(ctx context.Context, s Spec, names []string, lsn string) error {
	if len(names) == 0 {
		return nil
	}
	conn, err := m.Connect(ctx, s, "postgres")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	replayErr := awaitReplay(ctx, conn, s, lsn)
	var left int
	err = conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT pg_catalog.pg_terminate_backend(pid, $2))
		FROM pg_catalog.pg_stat_activity WHERE usename = ANY($1::text[]) AND pid <> pg_catalog.pg_backend_pid()`,
		names, terminateWaitMillis).Scan(&left)
	if err != nil {
		return fmt.Errorf("end credential sessions on %s: %w", s.ID, err)
	}
	if left > 0 {
		return fmt.Errorf("end credential sessions on %s: %d did not end within %d ms", s.ID, left, terminateWaitMillis)
	}
	return replayErr
}

// awaitReplay waits until a standby has replayed lsn; a primary (or an
// empty lsn) has nothing to wait for.
func awaitReplay(ctx context.Context, conn *pgx.Conn, s Spec, lsn string) error {
	if lsn == "" {
		return nil
	}
	deadline := time.Now().Add(StreamingWait)
	for {
		var done bool
		err := conn.QueryRow(ctx, `SELECT NOT pg_catalog.pg_is_in_recovery()
			OR COALESCE(pg_catalog.pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, lsn).Scan(&done)
		if err != nil {
			return fmt.Errorf("replay position of %s: %w", s.ID, err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("standby %s has not replayed %s within %v: a revoked credential may still log in there", s.ID, lsn, StreamingWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(proc.PollInterval):
		}
	}
}

// DropCredentials drops the stale credential roles on the primary, once
// their sessions have ended everywhere: in each database where one owns
// objects or holds privileges (pg_shdepend says which), what it owns
// passes to tsdbadmin and its privileges go; then the role. A role
// already gone is no error.
func (m *Instances) DropCredentials(ctx context.Context, s Spec, names []string) error {
	if len(names) == 0 {
		return nil
	}
	conn, err := m.Connect(ctx, s, "postgres")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SET synchronous_commit = local"); err != nil {
		return err
	}
	dbs, err := credentialDatabases(ctx, conn, names)
	if err != nil {
		return err
	}
	for db, roles := range dbs {
		if err := m.disown(ctx, s, db, roles); err != nil {
			return err
		}
	}
	var errs []error
	for _, name := range names {
		if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+QuoteIdent(name)); err != nil {
			errs = append(errs, fmt.Errorf("drop credential role %s on %s: %w", name, s.ID, err))
		}
	}
	return errors.Join(errs...)
}

// credentialDatabases maps each database where one of the roles has
// dependencies to those roles; shared objects (a database the role owns)
// are handled from the postgres database.
func credentialDatabases(ctx context.Context, conn *pgx.Conn, names []string) (map[string][]string, error) {
	rows, err := conn.Query(ctx, `SELECT DISTINCT COALESCE(d.datname::text, 'postgres'), a.rolname::text
		FROM pg_catalog.pg_shdepend sd
		JOIN pg_catalog.pg_authid a ON a.oid = sd.refobjid AND sd.refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass
		LEFT JOIN pg_catalog.pg_database d ON d.oid = sd.dbid
		WHERE a.rolname = ANY($1::text[]) AND (sd.dbid = 0 OR d.datallowconn)
		ORDER BY 1, 2`, names)
	if err != nil {
		return nil, fmt.Errorf("credential roles' databases: %w", err)
	}
	out := map[string][]string{}
	for rows.Next() {
		var db, role string
		if err := rows.Scan(&db, &role); err != nil {
			rows.Close()
			return nil, err
		}
		out[db] = append(out[db], role)
	}
	return out, rows.Err()
}

// disown passes what roles own in db to tsdbadmin and drops their
// privileges there, in one transaction.
func (m *Instances) disown(ctx context.Context, s Spec, db string, roles []string) error {
	conn, err := m.Connect(ctx, s, db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	quoted := make([]string, len(roles))
	for i, r := range roles {
		quoted[i] = QuoteIdent(r)
	}
	list := strings.Join(quoted, ", ")
	err = execTx(ctx, conn, []string{
		"SET LOCAL synchronous_commit = local",
		"REASSIGN OWNED BY " + list + " TO " + TenantRole,
		"DROP OWNED BY " + list,
	})
	if err != nil {
		return fmt.Errorf("reassign what %s own in %s on %s: %w", list, db, s.ID, err)
	}
	return nil
}
