package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ack is one commit the writer saw acknowledged, with the server that
// acknowledged it (its address and port as PostgreSQL sees them).
type ack struct {
	id     int
	server string
	port   int
	at     time.Time
}

// ackWriter inserts ids into acked (id int primary key) through a
// service's endpoint, one commit at a time, and records every commit
// acknowledged. A session writer keeps one connection (opened again
// after any error), as an application's pool does; a fresh one opens a
// connection per commit, as a new client does.
// The failover tests of both runtimes share it: what they check is that
// every recorded commit is on the new primary.
type ackWriter struct {
	fresh bool
	mu    sync.Mutex
	acks  []ack
	stop  chan struct{}
	done  chan struct{}
}

// startWriter writes ids from from on until halt, over one session
// unless fresh.
func (s *server) startWriter(svc service, password string, from int, fresh bool) *ackWriter {
	w := &ackWriter{fresh: fresh, stop: make(chan struct{}), done: make(chan struct{})}
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
	for i := from; ; i++ {
		select {
		case <-w.stop:
			return
		default:
		}
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			conn, _ = s.connect(cctx, svc, password)
			cancel()
			if conn == nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
		}
		var a ack
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := conn.QueryRow(qctx, "INSERT INTO acked VALUES ($1) RETURNING coalesce(host(inet_server_addr()), ''), coalesce(inet_server_port(), 0)", i).Scan(&a.server, &a.port)
		cancel()
		if err != nil || w.fresh {
			conn.Close(ctx)
			conn = nil
		}
		if err != nil {
			continue
		}
		a.id, a.at = i, time.Now()
		w.mu.Lock()
		w.acks = append(w.acks, a)
		w.mu.Unlock()
	}
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
	for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		var first time.Time
		got := 0
		for _, a := range w.snapshot() {
			if a.at.After(since) && from(a) {
				if got == 0 {
					first = a.at
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
// commits: how long the service took no writes.
func longestGap(acks []ack) (gap time.Duration, after time.Time) {
	for i := 1; i < len(acks); i++ {
		if d := acks[i].at.Sub(acks[i-1].at); d > gap {
			gap, after = d, acks[i-1].at
		}
	}
	return gap, after
}
