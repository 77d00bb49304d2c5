package console

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"dbcloud"
	"dbcloud/cloud"
	"dbcloud/identity"
)

// The SQL editor of a service (issue 36). Queries run as the signed-in
// person through a database credential of their own (decisions.md section
// 12): READ_ONLY for a viewer, READ_WRITE for the roles that may change
// resources. The credential is made when first needed and kept here, in
// memory, for the rest of its short life: its password is never sent to
// the browser, nor stored anywhere else. Each query runs with a statement
// timeout and its answer is capped at sqlRowCap rows.
const (
	sqlCredentialTTL = 15 * time.Minute
	// sqlReuseMargin: a credential this close to its expiry is replaced
	// rather than used for another query.
	sqlReuseMargin  = time.Minute
	sqlTimeout      = 10 * time.Second
	sqlRowCap       = 500
	sqlMaxQueryByte = 64 << 10
)

// sqlCredentials keeps each session's credential per service.
type sqlCredentials struct {
	mu sync.Mutex
	m  map[string]*cloud.NewCredential // session key + service ID
}

func newSQLCredentials() *sqlCredentials {
	return &sqlCredentials{m: map[string]*cloud.NewCredential{}}
}

// put keeps c for key and forgets the credentials that have expired.
func (s *sqlCredentials) put(key string, c *cloud.NewCredential, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, old := range s.m {
		if !now.Before(old.Expires) {
			delete(s.m, k)
		}
	}
	s.m[key] = c
}

// sqlResult is what a query answered, for the page.
type sqlResult struct {
	Query     string
	Columns   []string
	Rows      [][]string
	Truncated bool
	Tag       string
	// Error is PostgreSQL's report of a failed query.
	Error    string
	Took     time.Duration
	Username string
	Access   string
}

type sqlData struct {
	V      *cloud.ServiceView
	Result *sqlResult
	RowCap int
}

func (h *Handler) sqlGet(w http.ResponseWriter, r *http.Request, s *session) {
	h.sqlPage(w, r, s, h.fromQuery(r, s))
}

func (h *Handler) sqlPage(w http.ResponseWriter, r *http.Request, s *session, f flash) {
	pid, sid := r.PathValue("pid"), r.PathValue("sid")
	h.show(w, r, s, "sql", "SQL", f, func() (any, error) {
		v, err := h.cloud.GetService(r.Context(), pid, sid)
		return sqlData{V: v, Result: f.sql, RowCap: sqlRowCap}, err
	})
}

// sqlRun runs the form's query and shows its answer on the editor's page
// after a redirect, so a reload does not run it again.
func (h *Handler) sqlRun(w http.ResponseWriter, r *http.Request, s *session) {
	pid, sid := r.PathValue("pid"), r.PathValue("sid")
	query := r.PostFormValue("query")
	if len(query) > sqlMaxQueryByte {
		h.sqlPage(w, r, s, h.failed(r, dbcloud.Errorf(dbcloud.KindInvalid, "The query is longer than %d KiB.", sqlMaxQueryByte>>10)))
		return
	}
	cred, err := h.sqlCredential(r.Context(), s, pid, sid)
	if err != nil {
		h.sqlPage(w, r, s, h.failed(r, err))
		return
	}
	res := h.runSQL(r.Context(), cred, query)
	h.showOnce(w, r, s, "/p/"+pid+"/services/"+sid+"/sql", flash{sql: res})
}

// sqlCredential is the session's credential on the service: the one made
// before while it has life left, else a new one for the caller's role.
func (h *Handler) sqlCredential(ctx context.Context, s *session, pid, sid string) (*cloud.NewCredential, error) {
	key := onceKey(s) + "/" + sid
	h.sqlCreds.mu.Lock()
	c := h.sqlCreds.m[key]
	h.sqlCreds.mu.Unlock()
	if c != nil && time.Until(c.Expires) > sqlReuseMargin {
		return c, nil
	}
	access := dbcloud.CredentialReadWrite
	if role, _ := s.principal.RoleIn(pid); !role.Allows(identity.ChangeResources) {
		access = dbcloud.CredentialReadOnly
	}
	name := "console: " + s.principal.ID()
	if u := s.principal.User; u != nil {
		name = "console: " + u.Email
	}
	c, err := h.cloud.CreateCredential(ctx, pid, sid, cloud.CredentialCreate{
		Name: name, Access: string(access), TTLSeconds: int64(sqlCredentialTTL / time.Second),
	})
	if err != nil {
		return nil, err
	}
	h.sqlCreds.put(key, c, time.Now())
	return c, nil
}

// runSQL runs one query as the credential over TLS verified against the
// installation's CA, and reads at most sqlRowCap rows of its answer.
func (h *Handler) runSQL(ctx context.Context, cred *cloud.NewCredential, query string) *sqlResult {
	res := &sqlResult{Query: query, Username: cred.Username(), Access: string(cred.Access)}
	ctx, cancel := context.WithTimeout(ctx, sqlTimeout+5*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(cred.ConnectionString)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(h.caPEM) {
		res.Error = "The console has no CA to check the service's certificate with."
		return res
	}
	host, _, _ := net.SplitHostPort(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	cfg.TLSConfig = &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}
	cfg.RuntimeParams["statement_timeout"] = strconv.Itoa(int(sqlTimeout / time.Millisecond))
	cfg.RuntimeParams["application_name"] = "dbcloud console"
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	start := time.Now()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		res.Error = pgReport(err)
		return res
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, query)
	if err != nil {
		res.Error = pgReport(err)
		return res
	}
	for _, f := range rows.FieldDescriptions() {
		res.Columns = append(res.Columns, f.Name)
	}
	for rows.Next() {
		if len(res.Rows) == sqlRowCap {
			res.Truncated = true
			break
		}
		vals, err := rows.Values()
		if err != nil {
			res.Error = pgReport(err)
			break
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = cell(v)
		}
		res.Rows = append(res.Rows, row)
	}
	rows.Close()
	if err := rows.Err(); err != nil && res.Error == "" {
		res.Error = pgReport(err)
	}
	res.Tag = rows.CommandTag().String()
	res.Took = time.Since(start).Round(time.Millisecond)
	return res
}

// cell shows one value as psql would, NULL as NULL.
func cell(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case []byte:
		return fmt.Sprintf("\\x%x", v)
	case time.Time:
		return v.Format("2006-01-02 15:04:05.999999Z07:00")
	}
	return fmt.Sprint(v)
}

// pgReport is an error as PostgreSQL reports it: severity, message,
// SQLSTATE, and its detail and hint when there are.
func pgReport(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	out := fmt.Sprintf("%s: %s (SQLSTATE %s)", pe.Severity, pe.Message, pe.Code)
	if pe.Detail != "" {
		out += "\nDETAIL: " + pe.Detail
	}
	if pe.Hint != "" {
		out += "\nHINT: " + pe.Hint
	}
	return out
}
