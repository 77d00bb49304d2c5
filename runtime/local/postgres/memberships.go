package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// revokeReservedSQL takes from every role that is not a superuser its
// membership in a predefined role the guard refuses: a grant made before
// the guard refused it (pg_read_all_data and pg_write_all_data were
// grantable until issue 30) would otherwise outlive the upgrade. A
// membership through another role goes with the direct one it starts
// from. The roles kept are the guard's grantable_predefined
// (extensions/dbcloud_guard/roles.c, which says why each is harmless; the
// two lists change together). Predefined roles are the bootstrap's, below
// the first normal object ID (16384). When nothing is to revoke it writes
// nothing, so it never waits for a synchronous standby; when it does, its
// commit is local only.
const revokeReservedSQL = `DO $$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT r.rolname AS role, m.rolname AS member
    FROM pg_catalog.pg_auth_members a
    JOIN pg_catalog.pg_roles r ON r.oid = a.roleid
    JOIN pg_catalog.pg_roles m ON m.oid = a.member
    WHERE r.oid < 16384 AND r.rolname LIKE 'pg\_%' AND NOT m.rolsuper
      AND r.rolname <> ALL (ARRAY['pg_monitor', 'pg_read_all_settings', 'pg_read_all_stats',
        'pg_stat_scan_tables', 'pg_signal_backend'])
  LOOP
    PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    RAISE LOG 'dbcloud: revoking % from %: the guard refuses that membership', g.role, g.member;
    EXECUTE pg_catalog.format('REVOKE %I FROM %I', g.role, g.member);
  END LOOP;
END$$`

// RevokeReservedMemberships runs revokeReservedSQL on conn, a superuser
// session (memberships are cluster-wide: any database will do).
func RevokeReservedMemberships(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, revokeReservedSQL); err != nil {
		return fmt.Errorf("revoke reserved memberships: %w", err)
	}
	return nil
}
