package pgbouncer

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"dbcloud/runtime/local/postgres"
)

// ensureAuth makes the lookup role and function right. The role's
// attributes and memberships are re-asserted every time (tsdbadmin has
// CREATEROLE, which in PostgreSQL 15 reaches every non-superuser role);
// the function is installed in every database that can be connected to,
// template1 included so that new databases have it, but only in those not
// yet done (a marker file lists them by OID): connecting to template1 makes
// a concurrent CREATE DATABASE fail, so it happens once, not on every
// reconcile.
func (ps *Poolers) ensureAuth(ctx context.Context, p Spec, source postgres.Spec) error {
	conn, err := ps.instances.Connect(ctx, source, "postgres")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, poolerRoleSQL); err != nil {
		return fmt.Errorf("lookup role: %w", err)
	}
	// The marker is the cluster's: a different data directory (restored,
	// say) starts over.
	var sysID string
	if err := conn.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&sysID); err != nil {
		return err
	}
	rows, err := conn.Query(ctx, "SELECT oid::bigint, datname FROM pg_database WHERE datallowconn ORDER BY oid")
	if err != nil {
		return err
	}
	type database struct {
		oid  int64
		name string
	}
	var dbs []database
	for rows.Next() {
		var d database
		if err := rows.Scan(&d.oid, &d.name); err != nil {
			return err
		}
		dbs = append(dbs, d)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := ps.instances.MakeServerDir(p.Target, p.Dir); err != nil {
		return err
	}
	done := readAuthMarker(p.path(poolerAuthMarker), sysID)
	var installed []string
	for _, d := range dbs {
		key := strconv.FormatInt(d.oid, 10)
		if !done[key] {
			ok, err := ps.installLookup(ctx, source, d.name)
			if err != nil {
				return fmt.Errorf("lookup function in %s: %w", d.name, err)
			}
			if !ok {
				continue // not ours to fix; tried again next time
			}
		}
		installed = append(installed, key)
	}
	marker := "v" + poolerAuthVersion + " " + sysID + " " + strings.Join(installed, " ") + "\n"
	if err := ps.instances.WriteServerFile(p.Target, p.path(poolerAuthMarker), []byte(marker), 0o600); err != nil {
		return err
	}
	return nil
}

// readAuthMarker returns the OIDs of the databases that have the current
// lookup function, as the marker file lists them for this cluster.
func readAuthMarker(path, sysID string) map[string]bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	fields := strings.Fields(string(data))
	if len(fields) < 2 || fields[0] != "v"+poolerAuthVersion || fields[1] != sysID {
		return nil
	}
	done := map[string]bool{}
	for _, f := range fields[2:] {
		done[f] = true
	}
	return done
}

// installLookup creates the lookup function in one database. A schema
// "pgbouncer" someone else owns (a client may create one in a database it
// owns) is left alone: it reports false. PgBouncer then runs whatever
// function is there for that database, which can only refuse logins: the
// server checks every login's SCRAM proof itself, and PgBouncer's HBA never
// lets a client in as a role that enters by peer.
func (ps *Poolers) installLookup(ctx context.Context, source postgres.Spec, db string) (bool, error) {
	conn, err := ps.instances.Connect(ctx, source, db)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var owner string
	err = conn.QueryRow(ctx, "SELECT pg_get_userbyid(nspowner)::text FROM pg_namespace WHERE nspname = 'pgbouncer'").Scan(&owner)
	if err == nil && owner != "postgres" {
		ps.logger.Warn("schema pgbouncer belongs to another role; the pooler's lookup function is not installed there",
			"instance", source.ID, "database", db, "owner", owner)
		return false, nil
	}
	if _, err := conn.Exec(ctx, poolerLookupSQL); err != nil {
		return false, err
	}
	return true, nil
}

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

// poolerLookupSQL installs pgbouncer.get_auth in the current database. It
// runs as its owner, the superuser, with a fixed search_path, and answers
// only for roles that may log in, are not superusers and are not the lookup
// role; an expired password (VALID UNTIL) reads as none. Only the lookup
// role may call it.
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
	WHERE s.usename = p_usename
		AND NOT s.usesuper
		AND s.usename <> '` + postgres.PoolerRole + `'
$fn$;
ALTER FUNCTION pgbouncer.get_auth(text) OWNER TO postgres;
REVOKE ALL ON FUNCTION pgbouncer.get_auth(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO ` + postgres.PoolerRole + `;
`
