package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"dbcloud"
	"dbcloud/runtime/local/postgres"
)

// gatedConn is a client's connection that stops at its second write
// (after the startup message, the password's first message): the server
// process is forked and waits in the middle of the login.
type gatedConn struct {
	net.Conn
	writes  int
	waiting chan struct{} // closed at the second write
	gate    chan struct{} // closed to let it go on
	once    sync.Once
}

func (c *gatedConn) Write(p []byte) (int, error) {
	if c.writes++; c.writes == 2 {
		c.once.Do(func() { close(c.waiting) })
		<-c.gate
	}
	return c.Conn.Write(p)
}

// blueBeforeSwitch makes a service on PostgreSQL 15 with a table t, and
// its BLUE_GREEN upgrade to 17 as it is before the switch.
func blueBeforeSwitch(t *testing.T, name, pw string) (*Runtime, *dbcloud.Service, *bgRun) {
	t.Helper()
	rt := versionsRuntime(t)
	svc := newTestService(t, rt, name, pw, nil)
	svc.Spec.PGVersion = 15
	mustEnsure(t, rt, svc)
	mustExec(t, svc, pw, "CREATE TABLE t (v text)")
	b, err := rt.newBG(context.Background(), svc, 15, 17, func(dbcloud.UpgradeStep) {})
	if err != nil {
		t.Fatal(err)
	}
	return rt, svc, b
}

// holdBlue opens dbcloud's sessions on blue (a Direct one) and holds new
// sessions as the switch does, until the test ends.
func holdBlue(t *testing.T, b *bgRun) *blueSessions {
	t.Helper()
	ctx, blue := context.Background(), b.base
	sessions, err := b.openBlue(ctx, blue)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sessions.close(ctx) })
	t.Cleanup(func() {
		if err := b.releaseBlue(blue); err != nil {
			t.Error(err)
		}
	})
	if err := b.holdNewSessions(ctx, &bgState{Direct: true}, blue); err != nil {
		t.Fatal(err)
	}
	return sessions
}

// TestEndSessions_TellsWhy: a session the switch ends is told, in its
// error's message, that the service is switching to the new version
// (the guard library reads the reason dbcloud left in the data
// directory), with PostgreSQL's own message as the detail and its
// SQLSTATE 57P01, on which drivers connect again; the reason is gone
// once the sessions are ended.
func TestEndSessions_TellsWhy(t *testing.T) {
	const pw = "tells-why-password-1"
	_, svc, b := blueBeforeSwitch(t, "bgwhy", pw)
	ctx, blue := context.Background(), b.base
	client, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable", blue.RunDir(), blue.Port, pw))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close(ctx)
	sessions := holdBlue(t, b)
	if _, err := b.endAll(ctx, sessions, blue); err != nil {
		t.Fatalf("end sessions: %v", err)
	}
	// What the idle session was sent as it ended, read as a client
	// waiting on the connection reads it.
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = client.WaitForNotification(wait)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57P01" || !strings.Contains(pgErr.Message, "switching to PostgreSQL 17 (a BLUE_GREEN upgrade)") ||
		!strings.Contains(pgErr.Detail, "administrator command") {
		t.Errorf("the ended session of %s was told: %v (detail %q), want 57P01 naming the switch to 17, PostgreSQL's message as the detail", svc.ID, err, detailOf(pgErr))
	}
	if _, err := os.Lstat(filepath.Join(blue.PGData(), postgres.EndReasonFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the reason file after the sessions ended: %v, want gone", err)
	}
}

// isSwitching says err is the guard's refusal of a login to a sealed
// server.
func isSwitching(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57P03" && strings.Contains(pgErr.Message, "switching to a new PostgreSQL version")
}

func detailOf(e *pgconn.PgError) string {
	if e == nil {
		return ""
	}
	return e.Detail
}

// TestEndSessions_LoginInProgress: at a BLUE_GREEN switch of a Direct
// blue, a login that began before blue's pg_hba.conf was sealed (its
// server process checks the rules it was forked with) and finishes after
// the switch ended blue's sessions must not become a session that writes
// on blue after the WAL position the switch waits for; nor may a login
// once the service's OS user has let the held postmaster run on.
func TestEndSessions_LoginInProgress(t *testing.T) {
	const pw = "login-password-1"
	rt, svc, b := blueBeforeSwitch(t, "bglogin", pw)
	ctx, blue := context.Background(), b.base

	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable", blue.RunDir(), blue.Port, pw))
	if err != nil {
		t.Fatal(err)
	}
	login := &gatedConn{waiting: make(chan struct{}), gate: make(chan struct{})}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		login.Conn = c
		return login, err
	}
	wrote := make(chan error, 1)
	go func() {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			_, err = conn.Exec(ctx, "INSERT INTO t VALUES ('after the sessions ended')")
			conn.Close(ctx)
		}
		wrote <- err
	}()
	<-login.waiting

	sessions := holdBlue(t, b)
	// dbcloud's own look at the held service (a health check with its
	// measurement) gives up within its budget rather than wait for the
	// postmaster: it reports the server running, its database unasked.
	obs, err := rt.CheckService(ctx, svc, true)
	if err != nil || !obs.Running || obs.Metrics == nil || obs.Metrics.Database != nil {
		t.Errorf("a check of the held service: %+v %v, want running with the database unmeasured", obs, err)
	}
	postmaster, _ := rt.instances.Running(blue)
	ended, err := b.endAll(ctx, sessions, blue)
	if err != nil {
		t.Fatalf("end sessions: %v", err)
	}
	close(login.gate)
	if err := <-wrote; err == nil {
		t.Fatalf("a login begun before the seal wrote on blue after its sessions were ended (%d ended)", ended)
	} else {
		t.Logf("the login in progress, ended (%d ended): %v", ended, err)
	}
	// The service's OS user may let the postmaster run on (SIGCONT): a
	// new login is refused by the seal all the same, saying why.
	if err := syscall.Kill(postmaster, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	late, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable", blue.RunDir(), blue.Port, pw))
	if err == nil {
		_, err = late.Exec(ctx, "INSERT INTO t VALUES ('after a SIGCONT')")
		late.Close(ctx)
	}
	if !isSwitching(err) {
		t.Errorf("a login after a SIGCONT of the held postmaster: %v, want refused with 57P03, the service switching", err)
	}
	if v, err := rt.queryStrings(ctx, blue, "tsdb", "SELECT count(*)::text FROM public.t"); err != nil || len(v) != 1 || v[0] != "0" {
		t.Errorf("rows on blue: %q %v, want none", v, err)
	}
}

// TestFailed_CancelledSwitchServesBlue: when dbcloud stops in the middle
// of a switch (its context cancelled), the rest of the undo is left to
// the next attempt, but blue serves again at once: continued and
// unsealed, it takes a new login and a write, rather than the service
// being down for as long as dbcloud is.
func TestFailed_CancelledSwitchServesBlue(t *testing.T) {
	const pw = "cancelled-password-1"
	_, svc, b := blueBeforeSwitch(t, "bgcancel", pw)
	holdBlue(t, b)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.failed(cancelled, &bgState{From: 15, To: 17, Direct: true}, "switch", errors.New("stopped")); !errors.Is(err, context.Canceled) {
		t.Fatalf("failed with a cancelled context: %v, want context.Canceled", err)
	}
	blue := b.base
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable connect_timeout=5", blue.RunDir(), blue.Port, pw))
	if err == nil {
		_, err = c.Exec(ctx, "INSERT INTO t VALUES ('after the cancelled switch')")
		c.Close(ctx)
	}
	if err != nil {
		t.Errorf("a login and a write on %s after its switch was cancelled: %v, want blue serving", svc.ID, err)
	}
}
