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

// Connect returns a superuser connection over the unix socket in Dir/run:
// peer authentication maps the OS user dbcloud runs as to the postgres
// role, so no superuser password exists. The caller closes it.
func (m *Instances) Connect(ctx context.Context, s Spec, db string) (*pgx.Conn, error) {
	dsn := fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable application_name=dbcloud connect_timeout=10",
		QuoteDSN(s.RunDir()), s.Port, QuoteDSN(db))
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("connect to instance %s: %w", s.ID, err)
	}
	// The database belongs to a tenant, who may hold locks or make any
	// statement slow: dbcloud's own statements give up instead of waiting
	// behind them.
	cfg.RuntimeParams["lock_timeout"] = TenantLockTimeout
	cfg.RuntimeParams["statement_timeout"] = TenantStatementTimeout
	// The owner of a database sets its search_path (ALTER DATABASE ... SET
	// search_path = own_schema, pg_catalog); a function or table there
	// named like a catalog one would then run as, or be read by, the
	// superuser. A startup option outranks the database's setting.
	cfg.RuntimeParams["search_path"] = SuperuserSearchPath
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
