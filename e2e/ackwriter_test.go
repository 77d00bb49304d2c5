package e2e

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ack is one commit the writer saw acknowledged, with the server that
// acknowledged it (its address and port as PostgreSQL sees them).
type ack struct {
	id     int
	server string
	port   int
	at     time.Time
	// login and loggedIn bound the login of the connection that carried
	// it: where a failover's first write spent its time.
	login, loggedIn time.Time
}

// ackWriter inserts ids through a service's endpoint, one commit at a
// time, and records every commit acknowledged, and the server errors that
// ended its sessions or refused its connections. A session writer keeps
// one connection (opened again after any error), as an application's pool
// does; a fresh one opens a connection per commit, as a new client does.
// The failover tests of both runtimes and the BLUE_GREEN upgrade's share
// it: what they check is that every recorded commit is on the new primary.
type ackWriter struct {
	fresh  bool
	insert string // the INSERT of $1, returning the server's address and port
	mu     sync.Mutex
	acks   []ack
	// ended are the errors that ended sessions, refused those that
	// refused connections.
	ended, refused []endedSession
	stop           chan struct{}
	done           chan struct{}
}

// endedSession is a server's error that ended or refused a session.
type endedSession struct {
	err *pgconn.PgError
	at  time.Time
}

// ackedByServer is what an INSERT returns for ackWriter.
const ackedByServer = " RETURNING coalesce(host(inet_server_addr()), ''), coalesce(inet_server_port(), 0)"

// startWriter writes ids into acked (id int primary key) from from on
// until halt, over one session unless fresh.
func (s *server) startWriter(svc service, password string, from int, fresh bool) *ackWriter {
	return s.startWriterInto(svc, password, from, fresh, "INSERT INTO acked VALUES ($1)")
}

// startWriterInto is startWriter with the INSERT of $1 to run.
func (s *server) startWriterInto(svc service, password string, from int, fresh bool, insert string) *ackWriter {
	w := &ackWriter{fresh: fresh, insert: insert + ackedByServer, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(s, svc, password, from)
	return w
}

func (w *ackWriter) run(s *server, svc service, password string, from int) {
	defer close(w.done)
	ctx := context.Background()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(ctx)
		}
	}()
	var login, loggedIn time.Time
	for i := from; ; i++ {
		select {
		case <-w.stop:
			return
		default:
		}
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			var err error
			login = time.Now()
			conn, err = s.connect(cctx, svc, password)
			loggedIn = time.Now()
			cancel()
			if conn == nil {
				w.serverError(&w.refused, err)
				time.Sleep(5 * time.Millisecond)
				continue
			}
		}
		var a ack
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := conn.QueryRow(qctx, w.insert, i).Scan(&a.server, &a.port)
		cancel()
		if err != nil || w.fresh {
			conn.Close(ctx)
			conn = nil
		}
		if err != nil {
			w.serverError(&w.ended, err)
			continue
		}
		a.id, a.at, a.login, a.loggedIn = i, time.Now(), login, loggedIn
		w.mu.Lock()
		w.acks = append(w.acks, a)
		w.mu.Unlock()
	}
}

// serverError records err in to if the server sent it.
func (w *ackWriter) serverError(to *[]endedSession, err error) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		w.mu.Lock()
		*to = append(*to, endedSession{pe, time.Now()})
		w.mu.Unlock()
	}
}

// serverErrors returns the errors that ended sessions and refused connections.
func (w *ackWriter) serverErrors() (ended, refused []endedSession) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]endedSession(nil), w.ended...), append([]endedSession(nil), w.refused...)
}

// commitAfter waits until the writer has committed after t.
func (w *ackWriter) commitAfter(tb testing.TB, t time.Time) {
	tb.Helper()
	w.waitAcks(tb, 1, t, anyServer, time.Minute)
}

// snapshot is what was acknowledged so far.
func (w *ackWriter) snapshot() []ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ack(nil), w.acks...)
}

// halt stops the writer and returns every acknowledged commit.
func (w *ackWriter) halt() []ack {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	return w.snapshot()
}

// waitAcks waits until n commits were acknowledged after since by a
// server for which from is true, and returns when the first of them was.
func (w *ackWriter) waitAcks(t testing.TB, n int, since time.Time, from func(ack) bool, within time.Duration) time.Time {
	t.Helper()
	return w.waitFirst(t, n, since, from, within).at
}

// waitFirst is waitAcks returning the first of the n acknowledgements.
func (w *ackWriter) waitFirst(t testing.TB, n int, since time.Time, from func(ack) bool, within time.Duration) ack {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		var first ack
		got := 0
		for _, a := range w.snapshot() {
			if a.at.After(since) && from(a) {
				if got == 0 {
					first = a
				}
				got++
			}
		}
		if got >= n {
			return first
		}
		if time.Now().After(deadline) {
			w.halt()
			t.Fatalf("%d of %d commits acknowledged within %v", got, n, within)
		}
	}
}

// anyServer accepts every acknowledgement.
func anyServer(ack) bool { return true }

// lostAcks are the acknowledged ids c (the new primary) does not have.
func lostAcks(t testing.TB, c *pgx.Conn, acks []ack) []int {
	t.Helper()
	ids := make([]int, len(acks))
	for i, a := range acks {
		ids[i] = a.id
	}
	rows, err := c.Query(context.Background(), "SELECT u.id FROM unnest($1::int[]) AS u(id) WHERE NOT EXISTS (SELECT FROM acked a WHERE a.id = u.id) ORDER BY 1", ids)
	if err != nil {
		t.Fatal(err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return missing
}

// longestGap is the longest time between two consecutive acknowledged
// commits that ends after from and begins before to: how long the
// service took no writes then. Zero times leave that side open.
func longestGap(acks []ack, from, to time.Time) time.Duration {
	var gap time.Duration
	for i := 1; i < len(acks); i++ {
		if acks[i].at.After(from) && (to.IsZero() || acks[i-1].at.Before(to)) {
			gap = max(gap, acks[i].at.Sub(acks[i-1].at))
		}
	}
	return gap
}
