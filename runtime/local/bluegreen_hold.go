package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"dbcloud/runtime/local/postgres"

	"github.com/jackc/pgx/v5"
)

// At the switch of a Direct blue (its postmaster listens on the endpoint
// itself) new connections are held in the kernel rather than refused:
// blue's postmaster is stopped (SIGSTOP), so it accepts none, and a client
// that connects waits in the listen queue, costing nothing, instead of
// retrying against a refusal (each attempt a fork and a TLS handshake on
// the server the switch is waiting for). Its backends run on: the
// sessions being ended, the walsenders feeding green, and dbcloud's own
// sessions, opened beforehand since no new one can start. When blue goes
// (an immediate shutdown, once green has every commit) the held clients
// are told to connect again, and find the proxy on green. Its pg_hba.conf
// is sealed before, so that a client let in by a SIGCONT from elsewhere
// (the service's OS user may send one) is refused all the same.

// blueSessions are dbcloud's sessions on blue for the switch: one per
// database, opened before new sessions stop reaching blue.
type blueSessions struct {
	dbs   []bgDB
	conns map[string]*pgx.Conn
}

// openBlue opens a session on every database of blue.
func (b *bgRun) openBlue(ctx context.Context, blue postgres.Spec) (*blueSessions, error) {
	dbs, err := b.listDBs(ctx, blue)
	if err != nil {
		return nil, err
	}
	s := &blueSessions{dbs: dbs, conns: map[string]*pgx.Conn{}}
	for _, db := range append([]bgDB{{Name: "postgres"}}, dbs...) {
		if s.conns[db.Name] != nil {
			continue
		}
		conn, err := b.rt.instances.Connect(ctx, blue, db.Name)
		if err != nil {
			s.close(ctx)
			return nil, err
		}
		s.conns[db.Name] = conn
	}
	return s, nil
}

func (s *blueSessions) close(ctx context.Context) {
	for _, c := range s.conns {
		c.Close(context.WithoutCancel(ctx))
	}
}

// pids are the server processes of the sessions, which endSessions spares.
func (s *blueSessions) pids() []int64 {
	var out []int64
	for _, c := range s.conns {
		out = append(out, int64(c.PgConn().PID()))
	}
	return out
}

// strings reads one text column in the session of db.
func (s *blueSessions) strings(ctx context.Context, db, sql string, args ...any) ([]string, error) {
	conn, ok := s.conns[db]
	if !ok {
		return nil, fmt.Errorf("no session on database %s", db)
	}
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// holdNew stops blue's postmaster (SIGSTOP): new connections wait in the
// listen queue. The backends are not stopped.
func (b *bgRun) holdNew(blue postgres.Spec) error {
	pid, ok := b.rt.instances.Running(blue)
	if !ok {
		return fmt.Errorf("blue/green switch of %s: the old primary is not running", b.svc.ID)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("hold new connections to %s: %w", blue.ID, err)
	}
	return nil
}

// releaseBlue lets blue's postmaster run again, after first signalling
// sig to it when it is not 0: a stopped process takes signals only once it
// continues, and the signal is then handled before anything else it would
// do. Idempotent; nothing when blue does not run.
func (b *bgRun) releaseBlue(blue postgres.Spec, sig syscall.Signal) error {
	pid, ok := b.rt.instances.Running(blue)
	if !ok {
		return nil
	}
	if sig != 0 {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, os.ErrProcessDone) && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal %s: %w", blue.ID, err)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("continue %s: %w", blue.ID, err)
	}
	return nil
}
