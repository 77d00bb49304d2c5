package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	"github.com/jackc/pgx/v5/pgconn"
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
// are told to connect again, and find the proxy on green.
//
// Once new connections are held (stopped, or paused at the proxy), blue is
// sealed: the guard refuses every login but dbcloud's while the seal file
// is in the data directory (extensions/dbcloud_guard/ended.c), with 57P03
// and a message saying the service is switching. That covers what the hold
// does not: a login forked before the hold and still authenticating, one
// on blue's internal port or unix socket (the proxy layout's postmaster
// runs on), one let in by a SIGCONT of the held postmaster (the service's
// OS user may send one). It needs no reload, so the postmaster is stopped
// first and no client meets a refusal in between, and it takes no
// connection. pg_hba.conf is not sealed at the switch any more: a reload
// of a stopped postmaster cannot happen, the guard refuses over the unix
// socket as over TCP, and what the file lets the OS user do (delete it)
// pg_hba.conf would not stop either (it owns blue's processes). Only a
// postmaster started before the guard with the seal was installed is
// still sealed through pg_hba.conf (sealByHBA).

// blueSessions are dbcloud's sessions on blue for the switch, opened before
// new sessions stop reaching blue.
type blueSessions struct {
	dbs []bgDB
	// conns has a session on postgres (the cluster-wide views, the ending
	// of sessions, the WAL position, the passwords) and on every database
	// with sequences, whose values are read in the pause.
	conns map[string]*pgx.Conn
}

// openBlue opens dbcloud's sessions on blue: on postgres, and on the
// databases that have sequences. In the databases the copy covers, the
// upgrade's event trigger refuses CREATE SEQUENCE until the switch; a
// database created since (CREATE DATABASE fires no event trigger) makes
// the switch refuse, before anything is held (refuseNewDatabases) or, if
// made while the tenant's sessions ended, once they are (refuseDatabases-
// MadeMeanwhile). A session on
// every database would take connection slots that a tenant's pool may
// have filled up to the superuser-reserved ones; when even these are too
// few the switch fails saying so, before anything is held.
func (b *bgRun) openBlue(ctx context.Context, blue postgres.Spec) (*blueSessions, error) {
	admin, err := b.connectBlue(ctx, blue, "postgres")
	if err != nil {
		return nil, err
	}
	s := &blueSessions{conns: map[string]*pgx.Conn{"postgres": admin}}
	if s.dbs, err = dbsOf(ctx, admin); err != nil {
		s.close(ctx)
		return nil, err
	}
	for _, db := range s.dbs {
		if s.conns[db.Name] != nil {
			continue
		}
		conn, err := b.connectBlue(ctx, blue, db.Name)
		if err != nil {
			s.close(ctx)
			return nil, err
		}
		has, err := connStrings(ctx, conn, "SELECT EXISTS (SELECT FROM pg_catalog.pg_sequences)::text")
		if err != nil || len(has) != 1 || has[0] != "true" {
			conn.Close(context.WithoutCancel(ctx))
		} else {
			s.conns[db.Name] = conn
		}
		if err != nil {
			s.close(ctx)
			return nil, err
		}
	}
	return s, nil
}

// connectBlue opens one of dbcloud's sessions on blue. Refused for want of
// a connection slot (53300), the switch fails with what the user can do.
func (b *bgRun) connectBlue(ctx context.Context, blue postgres.Spec, db string) (*pgx.Conn, error) {
	conn, err := b.rt.instances.Connect(ctx, blue, db)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "53300" {
		return nil, &dbcloud.UpgradeFailed{Step: "switch", Reason: "the service's sessions use every connection slot, those reserved to the platform included: " +
			"the switch needs one on the postgres database and one on each database with sequences; close some sessions and try again"}
	}
	return conn, err
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
// or, for a Direct blue, in its listen queue; then it seals blue (the
// guard's seal file), which needs neither a reload nor a running
// postmaster.
func (b *bgRun) holdNewSessions(ctx context.Context, st *bgState, blue postgres.Spec) error {
	pid, ok := b.rt.instances.Running(blue)
	if !ok {
		return fmt.Errorf("blue/green switch of %s: the old primary is not running", b.svc.ID)
	}
	byHBA := !guardSeals(pid)
	if byHBA {
		b.rt.cfg.Logger.Warn("blue/green switch: the old primary runs a guard without the seal (started before it was installed); sealing pg_hba.conf",
			"service", b.svc.ID, "pid", pid)
	}
	if !st.Direct {
		if err := b.rt.pauseProxy(ctx, b.svc.ID, b.base.Owner, b.rt.proxyListen(b.svc), b.target(blue)); err != nil {
			return err
		}
	}
	if byHBA {
		// Before the stop, which a reload cannot follow: a Direct blue's
		// clients may meet pg_hba.conf's refusal for a moment, as before
		// the guard had the seal.
		if err := b.sealByHBA(ctx, blue); err != nil {
			return err
		}
	}
	if st.Direct {
		if err := b.holdNew(pid, blue); err != nil {
			return err
		}
	}
	return writeRootFile(blue, postgres.SealFile, "sealed by dbcloud for a BLUE_GREEN switch\n")
}

// sealByHBA reloads blue with a pg_hba.conf that lets in only dbcloud.
func (b *bgRun) sealByHBA(ctx context.Context, blue postgres.Spec) error {
	blue.Sealed = true
	_, err := b.rt.instances.Reload(ctx, blue)
	return err
}

// guardSeals reports whether the guard library that the postmaster pid has
// mapped knows the seal file: a postmaster keeps the library it started
// with, and one started before the guard with the seal was installed maps
// an older file (deleted by the install's rename, still readable through
// map_files).
func guardSeals(pid int) bool {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(maps)) {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[5], "/"+postgres.GuardLibrary+".so") {
			continue
		}
		return hasSeal(fmt.Sprintf("/proc/%d/map_files/%s", pid, f[0]))
	}
	return false
}

// hasSeal reads a guard library, bounded (the service's OS user controls
// what its postmaster maps), for the seal file's name.
func hasSeal(lib string) bool {
	f, err := os.Open(lib)
	if err != nil {
		return false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	return err == nil && bytes.Contains(b, []byte(postgres.SealFile+"\x00"))
}

// holdNew stops blue's postmaster (SIGSTOP): new connections wait in the
// listen queue. The backends are not stopped.
func (b *bgRun) holdNew(pid int, blue postgres.Spec) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("hold new connections to %s: %w", blue.ID, err)
	}
	return nil
}

// releaseBlue unseals blue and lets its postmaster run again (SIGCONT).
// Idempotent; the seal goes even when blue does not run, since it would
// refuse every login at its next start. The postmaster is continued even
// when the seal cannot go (the tenant's OS user can put a directory of
// that name there): a sealed server still serves its open sessions and
// dbcloud, a stopped one nobody.
func (b *bgRun) releaseBlue(blue postgres.Spec) error {
	unsealed := removeRootFile(blue, postgres.SealFile)
	pid, ok := b.rt.instances.Running(blue)
	if !ok {
		return unsealed
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return errors.Join(unsealed, fmt.Errorf("continue %s: %w", blue.ID, err))
	}
	return unsealed
}

// giveEndReason has the sessions of blue ended from now on told that the
// service is switching to the new version, rather than PostgreSQL's
// "terminating connection due to administrator command", until the
// returned func is called (cleanBlue clears it too, after a switch cut
// short). Without it they are ended all the same, with the standard
// message: not worth failing the switch for.
func (b *bgRun) giveEndReason(blue postgres.Spec) (clear func()) {
	reason := fmt.Sprintf("terminating connection: this service is switching to PostgreSQL %d (a BLUE_GREEN upgrade); connect again", b.to.Major)
	if err := writeRootFile(blue, postgres.EndReasonFile, reason+"\n"); err != nil {
		b.rt.cfg.Logger.Warn("the sessions ended at the switch are not told why", "service", b.svc.ID, "error", err)
	}
	return func() {
		if err := removeRootFile(blue, postgres.EndReasonFile); err != nil {
			b.rt.cfg.Logger.Warn("remove the reason given to ended sessions", "service", b.svc.ID, "error", err)
		}
	}
}

// writeRootFile writes a file of dbcloud's (the end reason, the seal) into
// blue's data directory, the tenant's: nothing in it is followed, and
// whatever has the name is unlinked first and the file made anew
// (O_EXCL), so root writes only an inode it made, never one the service's
// OS user put there (a hard link to another of its files).
func writeRootFile(blue postgres.Spec, name, content string) error {
	d, err := tenantfs.OpenDir(blue.PGData())
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := d.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(content)
	return errors.Join(err, f.Close())
}

func removeRootFile(blue postgres.Spec, name string) error {
	d, err := tenantfs.OpenDir(blue.PGData())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// endAll ends blue's sessions for the switch, right after the seal: the
// logins in progress are taken first, and the sessions told why.
func (b *bgRun) endAll(ctx context.Context, sessions *blueSessions, blue postgres.Spec) (int, error) {
	postmaster, ok := b.rt.instances.Running(blue)
	if !ok {
		return 0, fmt.Errorf("blue/green switch of %s: the old primary is not running", b.svc.ID)
	}
	logins, err := b.loginsInProgress(ctx, sessions, blue, postmaster)
	if err != nil {
		return 0, err
	}
	defer closeAll(logins)
	clearReason := b.giveEndReason(blue)
	defer clearReason()
	return b.endSessions(ctx, sessions, logins)
}

// endSessions ends every session of blue but dbcloud's own, and waits
// until each has left pg_stat_activity: a session in the middle of its
// commit finishes it first, and that commit must be in the WAL the switch
// waits for. It does not wait for the processes to be gone: a Direct
// blue's stopped postmaster reaps none of them meanwhile.
//
// The logins in progress when blue was sealed are ended too, and waited
// for (loginsInProgress, taken right after the seal): one that passed the guard's check before the
// seal could otherwise become a session once the others were ended, and
// commit after the WAL position the switch waits for. A login that begins
// later meets the seal, so it is not waited for: a client connecting in a
// loop (on blue's internal port, or its socket) cannot hold the switch up.
func (b *bgRun) endSessions(ctx context.Context, sessions *blueSessions, logins []*proc.Pidfd) (int, error) {
	ended := map[int]bool{}
	deadline := time.Now().Add(bgEndSessions)
	for {
		_, open, err := sessions.activity(ctx)
		if err != nil {
			return 0, err
		}
		var left []*proc.Pidfd
		for _, l := range logins {
			if !l.Exited() {
				left = append(left, l)
			}
		}
		if len(open) == 0 && len(left) == 0 {
			return len(ended), nil
		}
		if time.Now().After(deadline) {
			return 0, &dbcloud.UpgradeFailed{Step: "switch", Reason: fmt.Sprintf("%d sessions of the old cluster did not end within %v", len(open)+len(left), bgEndSessions)}
		}
		// Listed first, signalled after: in one WHERE clause the planner
		// may call pg_terminate_backend before the conditions that spare
		// the walsenders and dbcloud's own sessions.
		if len(open) > 0 {
			if _, err := sessions.strings(ctx, "postgres", `SELECT pg_terminate_backend(p)::text FROM unnest($1::int[]) p`, open); err != nil {
				return 0, err
			}
		}
		for _, l := range left {
			if err := l.Signal(syscall.SIGTERM); err != nil {
				return 0, fmt.Errorf("end a login in progress on %s: %w", b.svc.ID, err)
			}
			ended[l.Pid] = true
		}
		for _, pid := range open {
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

// loginsInProgress takes, once, after the seal, the children of blue's
// postmaster that pg_stat_activity does not show, but its logger: in
// PostgreSQL 15 and 17 a client backend appears there only at the end of
// its startup (pgstat_bestart, after the authentication), so these are the
// logins that may have passed the guard before the seal. Each is held by a
// pidfd, through which it is signalled and seen gone: the running
// postmaster of the proxy layout reaps them, and their PIDs may be reused.
// Children forked later meet the seal and are left alone.
//
// Checked against 15.20 and 17.12: of the postmaster's children, only
// the logger (no PGPROC) is missing from pg_stat_activity; the
// checkpointer, background writer, walwriter, archiver and the launchers
// are listed (PostgreSQL 14 and older add the stats collector, which is
// not, and ignores SIGTERM: a switch there would time out). A version
// added later is to be checked again: any other child missing there would
// be waited for, and the switch fail after bgEndSessions.
func (b *bgRun) loginsInProgress(ctx context.Context, sessions *blueSessions, blue postgres.Spec, postmaster int) ([]*proc.Pidfd, error) {
	// pg_stat_activity first: a login that reaches it before the listing
	// is a child not in known, waited for here; one that was there is a
	// session, which endSessions ends.
	known, _, err := sessions.activity(ctx)
	if err != nil {
		return nil, err
	}
	var out []*proc.Pidfd
	for _, pid := range b.rt.instances.Children(blue, postmaster) {
		// The logger's title is "postgres: logger", or with the
		// cluster's name "postgres: NAME: logger"; a session's ends with
		// what it does ("authentication"), after its user, database and
		// address: no login can end its title so.
		if known[pid] || strings.HasSuffix(strings.TrimSpace(strings.Join(proc.Args(pid), " ")), ": logger") {
			continue
		}
		p, err := proc.OpenPidfd(pid)
		if errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err != nil {
			closeAll(out)
			return nil, fmt.Errorf("end the logins in progress on %s: %w", b.svc.ID, err)
		}
		// Listed by PID: it may have exited since, and the PID been
		// taken by a process that is no child of blue's.
		if _, ppid, err := proc.State(pid); err != nil || ppid != postmaster {
			p.Close()
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

func closeAll(ps []*proc.Pidfd) {
	for _, p := range ps {
		p.Close()
	}
}
