package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Table is the table the chaos test writes acknowledged rows into.
const Table = "chaos_rows"

// DSN is how a user logs in: tsdbadmin over TLS verified against the CA.
// The simple protocol works through PgBouncer's transaction pooling too.
func DSN(ep Endpoint, password, caFile string) string {
	return fmt.Sprintf("postgresql://tsdbadmin:%s@%s/tsdb?sslmode=verify-full&sslrootcert=%s&connect_timeout=5&default_query_exec_mode=simple_protocol",
		url.QueryEscape(password), ep.Addr(), url.QueryEscape(caFile))
}

// ObserveLogins logs in to every service the API shows READY, through each
// of its endpoints (public, pooler, VPC), with the passwords the client
// knows, and reads its size setting and rows through the public endpoint.
// The logins run at once: each costs a TLS handshake and a backend's
// start, and a look at every service one after another was most of what
// a chaos round spent settling. m must not change meanwhile.
func ObserveLogins(ctx context.Context, caFile string, m *Model, w *World) {
	w.Logins = map[string][]Login{}
	var wg sync.WaitGroup
	for _, s := range m.Live() {
		a, ok := w.API[s.ID]
		if !ok || a.Status != "READY" || len(s.Passwords) == 0 {
			continue
		}
		var eps []struct {
			via string
			ep  Endpoint
		}
		add := func(via string, ep Endpoint) {
			eps = append(eps, struct {
				via string
				ep  Endpoint
			}{via, ep})
		}
		if a.Endpoint != nil {
			add("endpoint", *a.Endpoint)
		}
		if p := a.ConnectionPooler; p != nil && p.Endpoint != nil {
			add("pooler", *p.Endpoint)
		}
		if v := a.VPCEndpoint; v != nil {
			add("vpc", v.Endpoint)
		}
		logins := make([]Login, len(eps))
		w.Logins[s.ID] = logins
		for i, e := range eps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				logins[i] = login(ctx, e.via, e.ep, s, caFile)
			}()
		}
	}
	wg.Wait()
}

// login tries each known password in turn; the first accepted one is used
// to read what the checker needs.
func login(ctx context.Context, via string, ep Endpoint, s *Service, caFile string) Login {
	l := Login{Via: via}
	var conn *pgx.Conn
	for i, pw := range s.Passwords {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := pgx.Connect(cctx, DSN(ep, pw, caFile))
		cancel()
		if err == nil {
			conn, l.Password, l.Err = c, i, ""
			break
		}
		l.Err = err.Error()
	}
	if conn == nil {
		return l
	}
	defer conn.Close(context.WithoutCancel(ctx))
	qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if via != "endpoint" {
		var one int
		if err := conn.QueryRow(qctx, "SELECT 1").Scan(&one); err != nil {
			l.Err = "logged in, but SELECT 1 failed: " + err.Error()
		}
		return l
	}
	if err := conn.QueryRow(qctx, "SHOW shared_buffers").Scan(&l.SharedBuffers); err != nil {
		l.Err = "logged in, but SHOW shared_buffers failed: " + err.Error()
		return l
	}
	if len(s.Rows) == 0 {
		return l
	}
	rows, err := conn.Query(qctx, "SELECT id, payload FROM "+Table)
	if err == nil {
		l.Rows = map[int64]string{}
		var id int64
		var payload string
		_, err = pgx.ForEachRow(rows, []any{&id, &payload}, func() error {
			l.Rows[id] = payload
			return nil
		})
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			l.RowsErr = "the table " + Table + " does not exist"
		} else {
			l.RowsErr = err.Error()
		}
		l.Rows = nil
	}
	return l
}
