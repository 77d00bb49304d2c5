package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"
)

// ensureAuth makes the lookup right on source (the primary; a standby has
// it by replication, a fork from its parent's copy): the lookup role, with
// its attributes and memberships re-asserted every time (tsdbadmin has
// CREATEROLE, which in PostgreSQL 15 reaches every non-superuser role),
// dbcloud's database for the lookup and the function in it. No tenant
// database is connected to, but once, when that database is made: a
// session there (template1 above all) makes the tenant's CREATE DATABASE
// fail while it lasts.
func (ps *Poolers) ensureAuth(ctx context.Context, source postgres.Spec) error {
	conn, err := ps.connect(ctx, source, "postgres")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, poolerRoleSQL); err != nil {
		return fmt.Errorf("lookup role: %w", err)
	}
	made, err := ensureAuthDatabase(ctx, conn)
	if err != nil {
		return err
	}
	db, err := ps.connect(ctx, source, postgres.PoolerDatabase)
	if err != nil {
		return err
	}
	defer db.Close(context.WithoutCancel(ctx))
	if _, err := db.Exec(ctx, poolerLookupSQL); err != nil {
		return fmt.Errorf("lookup function: %w", err)
	}
	if made {
		ps.dropOldLookups(ctx, source, conn)
	}
	return nil
}

// dropOldLookups removes the copies of get_auth that earlier versions
// installed in every database (and so, through template1, in every
// database made since). Nothing reads them any more; they would only
// linger in the tenant's databases, where it cannot drop them. Only the
// superuser's schema goes, and only with nothing else in it. Best effort,
// once: a copy left behind is harmless.
func (ps *Poolers) dropOldLookups(ctx context.Context, source postgres.Spec, conn *pgx.Conn) {
	rows, err := conn.Query(ctx, `SELECT datname::text FROM pg_catalog.pg_database WHERE datallowconn AND datname <> $1 ORDER BY oid`,
		postgres.PoolerDatabase)
	if err != nil {
		ps.logger.Warn("list databases for old lookup functions", "instance", source.ID, "error", err)
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		ps.logger.Warn("list databases for old lookup functions", "instance", source.ID, "error", err)
		return
	}
	for _, name := range names {
		if err := ps.dropOldLookup(ctx, source, name); err != nil {
			ps.logger.Warn("drop an old lookup function", "instance", source.ID, "database", name, "error", err)
		}
	}
}

func (ps *Poolers) dropOldLookup(ctx context.Context, source postgres.Spec, db string) error {
	conn, err := ps.connect(ctx, source, db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, dropOldLookupSQL)
	return err
}

// dropOldLookupSQL drops schema pgbouncer and its get_auth when they are
// the superuser's and nothing else is there (a tenant's own schema of that
// name stays).
const dropOldLookupSQL = `
DO $$
BEGIN
	IF EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'pgbouncer' AND nspowner = 'postgres'::regrole) THEN
		DROP FUNCTION IF EXISTS pgbouncer.get_auth(text);
		DROP SCHEMA pgbouncer RESTRICT;
	END IF;
EXCEPTION WHEN dependent_objects_still_exist THEN
	NULL; -- something else is in it: all of it stays
END
$$`

// awaitLookup waits until target, a standby of the primary the lookup
// was made on (a read replica set's node), has replayed it: PgBouncer asks
// the instance it pools, and a client arriving before would be refused.
func (ps *Poolers) awaitLookup(ctx context.Context, target postgres.Spec) error {
	deadline := time.Now().Add(postgres.StreamingWait)
	for {
		err := ps.hasLookup(ctx, target)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pooler's lookup has not reached %s after %v: %w", target.ID, postgres.StreamingWait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(proc.PollInterval):
		}
	}
}

// hasLookup fails until target has the lookup's database and function.
func (ps *Poolers) hasLookup(ctx context.Context, target postgres.Spec) error {
	conn, err := ps.instances.Connect(ctx, target, postgres.PoolerDatabase)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.to_regprocedure('pgbouncer.get_auth(text)') IS NOT NULL`).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errors.New("no pgbouncer.get_auth yet")
	}
	return nil
}

// connect opens a superuser session whose commits are local: a
// synchronous standby that is down must not hold up the pooler.
func (ps *Poolers) connect(ctx context.Context, source postgres.Spec, db string) (*pgx.Conn, error) {
	conn, err := ps.instances.Connect(ctx, source, db)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "SET synchronous_commit = local"); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// AuthDatabaseTakenError says a database named postgres.PoolerDatabase
// exists that is not dbcloud's: a tenant made it before the name was
// reserved. It is never used for the lookup (its owner could answer it).
type AuthDatabaseTakenError struct {
	Owner string
}

func (e *AuthDatabaseTakenError) Error() string {
	return fmt.Sprintf("database %s belongs to %s, not to the superuser", postgres.PoolerDatabase, e.Owner)
}

// ensureAuthDatabase creates the lookup's database when it is missing and
// keeps everyone but the lookup role out of it. It is the superuser's, so
// no tenant can drop, rename or change it, and made from template0, so
// nothing a tenant put in template1 comes with it. It reports whether it
// made the database.
func ensureAuthDatabase(ctx context.Context, conn *pgx.Conn) (bool, error) {
	made := false
	for attempt := 0; ; attempt++ {
		var owner string
		err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_get_userbyid(datdba)::text FROM pg_catalog.pg_database WHERE datname = $1`,
			postgres.PoolerDatabase).Scan(&owner)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && attempt == 0:
			_, err := conn.Exec(ctx, "CREATE DATABASE "+postgres.QuoteIdent(postgres.PoolerDatabase)+" OWNER postgres TEMPLATE template0")
			var pgErr *pgconn.PgError
			if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P04") { // 42P04: made meanwhile
				return false, fmt.Errorf("create lookup database: %w", err)
			}
			made = err == nil
			continue
		case err != nil:
			return false, fmt.Errorf("lookup database: %w", err)
		case owner != "postgres":
			return false, &AuthDatabaseTakenError{Owner: owner}
		}
		if _, err := conn.Exec(ctx, authDatabaseACLSQL); err != nil {
			return false, fmt.Errorf("lookup database privileges: %w", err)
		}
		return made, nil
	}
}

// authDatabaseACLSQL leaves CONNECT on the lookup's database to its owner
// and the lookup role only: whatever else was granted (PUBLIC has CONNECT
// and TEMPORARY by default) is revoked. When all is in place it writes
// nothing.
const authDatabaseACLSQL = `
DO $$
DECLARE g oid;
BEGIN
	FOR g IN
		SELECT DISTINCT a.grantee
		FROM pg_catalog.pg_database d,
			pg_catalog.aclexplode(COALESCE(d.datacl, pg_catalog.acldefault('d', d.datdba))) a
		WHERE d.datname = '` + postgres.PoolerDatabase + `'
			AND a.grantee <> d.datdba AND a.grantee <> '` + postgres.PoolerRole + `'::regrole
	LOOP
		IF g = 0 THEN
			REVOKE ALL ON DATABASE ` + postgres.PoolerDatabase + ` FROM PUBLIC;
		ELSE
			EXECUTE format('REVOKE ALL ON DATABASE ` + postgres.PoolerDatabase + ` FROM %I', pg_catalog.pg_get_userbyid(g));
		END IF;
	END LOOP;
	IF NOT pg_catalog.has_database_privilege('` + postgres.PoolerRole + `', '` + postgres.PoolerDatabase + `', 'CONNECT') THEN
		GRANT CONNECT ON DATABASE ` + postgres.PoolerDatabase + ` TO ` + postgres.PoolerRole + `;
	END IF;
END
$$`

// poolerRoleSQL creates the lookup role and resets whatever a CREATEROLE
// client may have changed about it: attributes, password, settings and
// memberships either way.
const poolerRoleSQL = `
DO $$
DECLARE g record;
BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '` + postgres.PoolerRole + `') THEN
		CREATE ROLE ` + postgres.PoolerRole + `;
	END IF;
	FOR g IN
		SELECT r.rolname AS role, m.rolname AS member
		FROM pg_catalog.pg_auth_members a
		JOIN pg_catalog.pg_roles r ON r.oid = a.roleid
		JOIN pg_catalog.pg_roles m ON m.oid = a.member
		WHERE r.rolname = '` + postgres.PoolerRole + `' OR m.rolname = '` + postgres.PoolerRole + `'
	LOOP
		EXECUTE format('REVOKE %I FROM %I', g.role, g.member);
	END LOOP;
END
$$;
ALTER ROLE ` + postgres.PoolerRole + ` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS
	CONNECTION LIMIT -1 PASSWORD NULL VALID UNTIL 'infinity';
ALTER ROLE ` + postgres.PoolerRole + ` RESET ALL;
`

// poolerLookupSQL installs pgbouncer.get_auth in the lookup's database.
// It runs as its owner, the superuser, with a fixed search_path, and
// answers only for tenant roles: roles that may log in, are neither
// superusers nor replication roles, and whose name is none of the reserved
// ones (postgres, dbcloud_*, pg_*) in any case and with any spaces around,
// so that no role made to look like dbcloud's passes either; database
// credentials (postgres.CredentialPrefix and an ID, exactly) are the one
// exception: only dbcloud makes them, the guard refusing the tenant every
// name that folds to dbcloud_*. An expired password (VALID UNTIL) reads as
// none, so an expired credential is refused here too. Only the lookup role
// may call it.
const poolerLookupSQL = `
CREATE SCHEMA IF NOT EXISTS pgbouncer AUTHORIZATION postgres;
REVOKE ALL ON SCHEMA pgbouncer FROM PUBLIC;
GRANT USAGE ON SCHEMA pgbouncer TO ` + postgres.PoolerRole + `;
CREATE OR REPLACE FUNCTION pgbouncer.get_auth(p_usename text)
RETURNS TABLE (usename name, passwd text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
	SELECT s.usename,
		CASE WHEN s.valuntil < pg_catalog.now() THEN NULL ELSE s.passwd END
	FROM pg_catalog.pg_shadow s
	CROSS JOIN LATERAL (SELECT pg_catalog.lower(pg_catalog.btrim(p_usename, E' \t\n\r\f\x0b')) AS folded) n
	WHERE s.usename = p_usename
		AND NOT s.usesuper
		AND NOT s.userepl
		AND (s.usename ~ '^dbcloud_cred_[a-z0-9]+$'
			OR (n.folded <> 'postgres'
				AND n.folded NOT LIKE 'dbcloud\_%'
				AND n.folded NOT LIKE 'pg\_%'))
$fn$;
ALTER FUNCTION pgbouncer.get_auth(text) OWNER TO postgres;
REVOKE ALL ON FUNCTION pgbouncer.get_auth(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO ` + postgres.PoolerRole + `;
`
