package postgres

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud/internal/tenantfs"
)

// Limits of dbcloud's statements on tenant databases (see Connect).
const (
	TenantLockTimeout      = "3s"
	TenantStatementTimeout = "5min"
)

// SuperuserSearchPath is the search_path of dbcloud's superuser sessions:
// only the system catalogs, never a schema a tenant can create objects in.
// Statements that create objects name their schema.
const SuperuserSearchPath = "pg_catalog, pg_temp"

// superuserSessionSettings are sent by dbcloud's superuser sessions as
// startup parameters. A startup parameter outranks whatever is attached to
// the database or to roles in it (ALTER DATABASE ... SET, ALTER ROLE ALL IN
// DATABASE ... SET), which the database's owner, a tenant, chooses. These
// are the settings PostgreSQL lets such an owner attach (context user) that
// would break dbcloud's statements or change what they mean:
//   - who runs them: role (SET ROLE at login, to the owner's own role);
//   - whether and how long they run: default_transaction_read_only,
//     default_transaction_isolation and _deferrable (serialization
//     failures, waits), idle_session_timeout and
//     idle_in_transaction_session_timeout (lock_timeout and
//     statement_timeout are dbcloud's own limits, set in Connect);
//   - where they write: default_tablespace (pg_global refuses every table),
//     default_table_access_method;
//   - what they mean: search_path (SuperuserSearchPath: a function or
//     table in the owner's schema named like a catalog one would otherwise
//     run as, or be read by, the superuser),
//     standard_conforming_strings (QuoteLiteral assumes on: off turns a
//     backslash in a literal into an escape), DateStyle, IntervalStyle,
//     TimeZone, bytea_output, extra_float_digits (values read as text),
//     client_encoding, check_function_bodies;
//   - what they leave behind: synchronous_commit (off acknowledges a commit
//     a crash may lose), client_min_messages;
//   - whether they start at all: local_preload_libraries and
//     session_preload_libraries (a missing library refuses every login),
//     and tsdb_admin.read_only_connection.
//
// Left out: tsdb_admin.read_only_role (no client may send it, not even a
// superuser, and a postmaster keeps the guard it started with; the guard
// ignores it on superuser sessions instead), transaction_read_only (it
// lasts only the login's own transaction, and asking read-write fails on a
// standby), settings a
// tenant cannot attach (superuser context, such as session_replication_role
// or timescaledb.restoring; dbcloud_guard.storage_read_only is a reload
// setting), and settings that only make a statement slower (planner and
// memory settings), which statement_timeout bounds.
func superuserSessionSettings() map[string]string {
	return map[string]string{
		"role":                                "none",
		"default_transaction_read_only":       "off",
		"default_transaction_isolation":       "read committed",
		"default_transaction_deferrable":      "off",
		"idle_session_timeout":                "0",
		"idle_in_transaction_session_timeout": "0",
		"default_tablespace":                  "",
		"default_table_access_method":         "heap",
		"search_path":                         SuperuserSearchPath,
		"standard_conforming_strings":         "on",
		"DateStyle":                           "ISO, MDY",
		"IntervalStyle":                       "postgres",
		"TimeZone":                            "UTC",
		"bytea_output":                        "hex",
		"extra_float_digits":                  "1",
		"client_encoding":                     "UTF8",
		"check_function_bodies":               "on",
		"synchronous_commit":                  "on",
		"client_min_messages":                 "notice",
		"local_preload_libraries":             "",
		"session_preload_libraries":           "",
		"tsdb_admin.read_only_connection":     "off",
	}
}

// Connect returns a superuser connection over the unix socket in Dir/run:
// peer authentication maps the OS user dbcloud runs as to the postgres
// role, so no superuser password exists. The caller closes it.
func (m *Instances) Connect(ctx context.Context, s Spec, db string) (*pgx.Conn, error) {
	return m.ConnectWith(ctx, s, db, nil)
}

// ConnectWith is Connect with more startup settings, which a statement
// that must come first in its session (TimescaleDB's ALTER EXTENSION ...
// UPDATE) cannot SET itself.
func (m *Instances) ConnectWith(ctx context.Context, s Spec, db string, settings map[string]string) (*pgx.Conn, error) {
	dsn := fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable application_name=dbcloud connect_timeout=10",
		QuoteDSN(s.RunDir()), s.Port, QuoteDSN(db))
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("connect to instance %s: %w", s.ID, err)
	}
	// The database belongs to a tenant, who may attach settings to it
	// (superuserSessionSettings): a startup parameter outranks them.
	for k, v := range superuserSessionSettings() {
		cfg.RuntimeParams[k] = v
	}
	// The tenant may also hold locks or make any statement slow: dbcloud's
	// own statements give up instead of waiting behind them.
	cfg.RuntimeParams["lock_timeout"] = TenantLockTimeout
	cfg.RuntimeParams["statement_timeout"] = TenantStatementTimeout
	for k, v := range settings {
		cfg.RuntimeParams[k] = v
	}
	// The socket directory is the service user's: a link there in place of
	// the socket would connect root, as the superuser by peer identity, to
	// the server of whatever socket it names (another service's).
	cfg.DialFunc = dialSocket
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to instance %s: %w", s.ID, err)
	}
	return conn, nil
}

// dialSocket connects to a server's unix socket through tenantfs, which
// follows no link; Connect never dials anything else.
func dialSocket(ctx context.Context, network, addr string) (net.Conn, error) {
	if network != "unix" {
		return nil, fmt.Errorf("dial %s %s: superuser connections use the unix socket only", network, addr)
	}
	return tenantfs.DialUnix(ctx, addr)
}

// QuoteDSN quotes a keyword/value connection string value.
func QuoteDSN(v string) string {
	v = strings.ReplaceAll(v, `\`, `\\`)
	return "'" + strings.ReplaceAll(v, `'`, `\'`) + "'"
}

// Exec runs SQL as the superuser on database db (see Connect).
func (m *Instances) Exec(ctx context.Context, s Spec, db, sql string, args ...any) error {
	if _, ok := ctx.Deadline(); !ok {
		// Past statement_timeout, also the connection is not waited for.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 6*time.Minute)
		defer cancel()
	}
	conn, err := m.Connect(ctx, s, db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("exec on instance %s: %w", s.ID, err)
	}
	return nil
}

// QuoteLiteral quotes a string as an SQL literal (standard_conforming_strings on).
func QuoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// QuoteIdent quotes an SQL identifier.
func QuoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// ProbeTLS proves that addr serves PostgreSQL over TLS with a certificate
// for serverName from roots: it sends PostgreSQL's SSLRequest and completes
// a verified handshake, as a client with sslmode=verify-full would.
func ProbeTLS(ctx context.Context, addr, serverName string, roots *x509.CertPool) error {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("endpoint %s: %w", addr, err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	req := make([]byte, 8)
	binary.BigEndian.PutUint32(req[0:4], 8)
	binary.BigEndian.PutUint32(req[4:8], 80877103) // SSLRequest code
	if _, err := conn.Write(req); err != nil {
		return fmt.Errorf("endpoint %s: %w", addr, err)
	}
	answer := make([]byte, 1)
	if _, err := io.ReadFull(conn, answer); err != nil || answer[0] != 'S' {
		return fmt.Errorf("endpoint %s does not offer TLS (answer %q, %v)", addr, answer, err)
	}
	tc := tls.Client(conn, &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12})
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("endpoint %s TLS handshake: %w", addr, err)
	}
	return nil
}
