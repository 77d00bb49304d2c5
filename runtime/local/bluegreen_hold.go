package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"dbcloud"
	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/internal/proc"
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
func (s *blueSessions) pids() []int {
	var out []int
	for _, c := range s.conns {
		out = append(out, int(c.PgConn().PID()))
	}
	return out
}

// strings reads one text column in the session of db.
func (s *blueSessions) strings(ctx context.Context, db, sql string, args ...any) ([]string, error) {
	conn, ok := s.conns[db]
	if !ok {
		return nil, fmt.Errorf("no session on database %s", db)
	}
	return connStrings(ctx, conn, sql, args...)
}

// readyDirect readies the switch of a Direct blue outside its pause: the
// proxy that is to take the endpoint starts, bound to nothing, and a
// checkpoint on blue leaves little WAL to recover at its next start.
func (b *bgRun) readyDirect(ctx context.Context, blue, green postgres.Spec) error {
	if err := b.rt.setProxy(ctx, b.svc.ID, b.base.Owner, nil, b.target(green)); err != nil {
		return err
	}
	return b.execEach(ctx, blue, "postgres", false, "CHECKPOINT")
}

// holdNewSessions stops new sessions reaching blue: held at the proxy,
// or, for a Direct blue, in its listen queue (bluegreen_hold.go). Blue's
// pg_hba.conf is sealed as well (a reload), after the proxy holds them
// and before the listen queue does: the service's OS user could reach
// blue on its own port or let its postmaster run on (SIGCONT), and would
// be refused all the same.
func (b *bgRun) holdNewSessions(ctx context.Context, st *bgState, blue postgres.Spec) error {
	if !st.Direct {
		if err := b.rt.pauseProxy(ctx, b.svc.ID, b.base.Owner, b.rt.proxyListen(b.svc), b.target(blue)); err != nil {
			return err
		}
	}
	sealed := blue
	sealed.Sealed = true
	if _, err := b.rt.instances.Reload(ctx, sealed); err != nil {
		return err
	}
	if !st.Direct {
		return nil
	}
	return b.holdNew(blue)
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

// releaseBlue lets blue's postmaster run again (SIGCONT). Idempotent;
// nothing when blue does not run.
func (b *bgRun) releaseBlue(blue postgres.Spec) error {
	pid, ok := b.rt.instances.Running(blue)
	if !ok {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("continue %s: %w", blue.ID, err)
	}
	return nil
}

// endReasonFile is where the guard library finds the reason it gives the
// sessions dbcloud ends (extensions/dbcloud_guard/ended.c).
const endReasonFile = "dbcloud_end_reason"

// giveEndReason has the sessions of blue ended from now on told that the
// service is switching to the new version, rather than PostgreSQL's
// "terminating connection due to administrator command", until the
// returned func is called (cleanBlue clears it too, after a switch cut
// short). Without it they are ended all the same, with the standard
// message: not worth failing the switch for.
func (b *bgRun) giveEndReason(blue postgres.Spec) (clear func()) {
	reason := fmt.Sprintf("terminating connection: this service is switching to PostgreSQL %d (a BLUE_GREEN upgrade); connect again", b.to.Major)
	if err := writeEndReason(blue, reason); err != nil {
		b.rt.cfg.Logger.Warn("the sessions ended at the switch are not told why", "service", b.svc.ID, "error", err)
	}
	return func() {
		if err := clearEndReason(blue); err != nil {
			b.rt.cfg.Logger.Warn("remove the reason given to ended sessions", "service", b.svc.ID, "error", err)
		}
	}
}

// writeEndReason and clearEndReason write and remove the file in the
// data directory, the tenant's: nothing in it is followed.
func writeEndReason(blue postgres.Spec, reason string) error {
	d, err := tenantfs.OpenDir(blue.PGData())
	if err != nil {
		return err
	}
	defer d.Close()
	f, err := d.OpenFile(endReasonFile, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(reason + "\n")
	return errors.Join(err, f.Close())
}

func clearEndReason(blue postgres.Spec) error {
	d, err := tenantfs.OpenDir(blue.PGData())
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Remove(endReasonFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// endSessions ends every session of blue but dbcloud's own, and waits
// until each has left pg_stat_activity: a session in the middle of its
// commit finishes it first, and that commit must be in the WAL the switch
// waits for. It does not wait for the processes to be gone: a Direct
// blue's stopped postmaster reaps none of them meanwhile.
//
// A session still authenticating is not in pg_stat_activity yet, and its
// server process checks the pg_hba.conf its postmaster had when it forked
// it, which may be the one before the seal: left alone, it could finish
// its login once the others were ended, and commit after the WAL position
// the switch waits for. So every process of blue that pg_stat_activity
// does not show (but its logger, and the ended ones left unreaped) is a
// login in progress: it is ended too (SIGTERM), and waited for.
func (b *bgRun) endSessions(ctx context.Context, sessions *blueSessions, blue postgres.Spec, postmaster int) (int, error) {
	ended := map[int]bool{}
	deadline := time.Now().Add(bgEndSessions)
	for {
		known, open, err := sessions.activity(ctx)
		if err != nil {
			return 0, err
		}
		logins := b.loginsInProgress(blue, postmaster, known)
		if len(open) == 0 && len(logins) == 0 {
			return len(ended), nil
		}
		if time.Now().After(deadline) {
			return 0, &dbcloud.UpgradeFailed{Step: "switch", Reason: fmt.Sprintf("%d sessions of the old cluster did not end within %v", len(open)+len(logins), bgEndSessions)}
		}
		// Listed first, signalled after: in one WHERE clause the planner
		// may call pg_terminate_backend before the conditions that spare
		// the walsenders and dbcloud's own sessions.
		if len(open) > 0 {
			if _, err := sessions.strings(ctx, "postgres", `SELECT pg_terminate_backend(p)::text FROM unnest($1::int[]) p`, open); err != nil {
				return 0, err
			}
		}
		for _, pid := range logins {
			if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
				return 0, fmt.Errorf("end a login in progress on %s: %w", b.svc.ID, err)
			}
		}
		for _, pid := range append(open, logins...) {
			ended[pid] = true
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// activity lists every process pg_stat_activity shows, and of them the
// client sessions that are not dbcloud's own.
func (s *blueSessions) activity(ctx context.Context) (known map[int]bool, sessions []int, err error) {
	rows, err := s.conns["postgres"].Query(ctx, `SELECT pid, backend_type = 'client backend' AND pid <> ALL($1::int[]) FROM pg_stat_activity`, s.pids())
	if err != nil {
		return nil, nil, err
	}
	known = map[int]bool{}
	var pid int
	var session bool
	_, err = pgx.ForEachRow(rows, []any{&pid, &session}, func() error {
		known[pid] = true
		if session {
			sessions = append(sessions, pid)
		}
		return nil
	})
	return known, sessions, err
}

// loginsInProgress are the children of blue's postmaster that are not
// in known (pg_stat_activity) but its logger: logins in progress.
func (b *bgRun) loginsInProgress(blue postgres.Spec, postmaster int, known map[int]bool) []int {
	var out []int
	for _, pid := range b.rt.instances.Children(blue, postmaster) {
		// The logger's title is "postgres: logger", or with the
		// cluster's name "postgres: NAME: logger"; a session's ends with
		// what it does ("authentication"), after its user, database and
		// address: no login can end its title so.
		if !known[pid] && !strings.HasSuffix(strings.TrimSpace(strings.Join(proc.Args(pid), " ")), ": logger") {
			out = append(out, pid)
		}
	}
	return out
}
