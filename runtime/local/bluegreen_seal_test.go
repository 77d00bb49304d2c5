package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/internal/pgtest"
	"dbcloud/runtime/local/postgres"
)

// loginLoop has n clients log in to blue over its unix socket as the
// tenant, each again as soon as its last login ended, until the test
// ends; it counts the attempts and keeps every error.
type loginLoop struct {
	attempts atomic.Int64
	mu       sync.Mutex
	errs     []error
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startLogins(t *testing.T, blue postgres.Spec, pw string, n int) *loginLoop {
	t.Helper()
	l := &loginLoop{stop: make(chan struct{})}
	dsn := fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable", blue.RunDir(), blue.Port, pw)
	for range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				// Bounded: a login held by a stopped postmaster the test
				// failed to continue must not outlive the test.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				c, err := pgx.Connect(ctx, dsn)
				if err == nil {
					c.Close(ctx)
				} else {
					l.mu.Lock()
					l.errs = append(l.errs, err)
					l.mu.Unlock()
				}
				cancel()
				l.attempts.Add(1)
			}
		}()
	}
	t.Cleanup(func() { l.end() })
	return l
}

// waitAttempts waits until n more logins were attempted.
func (l *loginLoop) waitAttempts(t *testing.T, n int64) {
	t.Helper()
	want := l.attempts.Load() + n
	deadline := time.Now().Add(30 * time.Second)
	for l.attempts.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d logins attempted, want %d", l.attempts.Load(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// end stops the clients and returns the errors they met.
func (l *loginLoop) end() []error {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errs
}

// TestHoldNewSessions_DirectHoldsLogins: while clients log in to a Direct
// blue in a loop, holding new sessions for the switch (and letting them
// in again, as an undone switch does) never refuses a login with
// pg_hba.conf's 28000, which drivers take as final: a login is held in
// the listen queue, or, begun before the hold and authenticated after
// the seal, refused with the guard's 57P03 saying the service switches.
// Five holds, each after more logins were attempted.
func TestHoldNewSessions_DirectHoldsLogins(t *testing.T) {
	const pw = "hold-logins-password-1"
	_, svc, b := blueBeforeSwitch(t, "bghold", pw)
	ctx, blue := context.Background(), b.base
	// The postmaster runs the installed guard, which has the seal: no
	// pg_hba.conf reload is needed (guardSeals); a process without it has
	// none.
	if pid, _ := b.rt.instances.Running(blue); !guardSeals(pid) {
		t.Fatalf("blue's postmaster %d: no guard with the seal (scripts/guard.sh installs it)", pid)
	}
	if guardSeals(os.Getpid()) {
		t.Errorf("the test process, without the guard, seals")
	}
	sessions, err := b.openBlue(ctx, blue)
	if err != nil {
		t.Fatal(err)
	}
	defer sessions.close(ctx)
	ha, err := b.ha()
	if err != nil {
		t.Fatal(err)
	}
	st := &bgState{Direct: true}
	t.Cleanup(func() {
		if _, err := b.serveBlue(ctx, ha, st); err != nil {
			t.Error(err)
		}
	})
	logins := startLogins(t, blue, pw, 4)
	for range 5 {
		logins.waitAttempts(t, 20)
		if err := b.holdNewSessions(ctx, st, blue); err != nil {
			t.Fatal(err)
		}
		if _, err := b.serveBlue(ctx, ha, st); err != nil {
			t.Fatal(err)
		}
	}
	logins.waitAttempts(t, 20)
	errs := logins.end()
	var other []error
	for _, err := range errs {
		if !isSwitching(err) {
			other = append(other, err)
		}
	}
	if len(other) > 0 {
		t.Errorf("%d logins to %s across its holds failed otherwise than with 57P03 (the switch), the first: %v; want each let in, held, or refused with 57P03",
			len(other), svc.ID, other[0])
	}
	t.Logf("%d logins attempted; %d refused by the seal", logins.attempts.Load(), len(errs))
}

// TestEndSessions_LoginsInALoop: a client that logs in to a sealed blue
// in a loop (the proxy layout's postmaster runs on, and anyone on the host
// reaches its internal port, the service's OS user its socket) is refused
// each time with the guard's 57P03, and does not hold up the ending of
// blue's sessions: only the logins in progress when the seal took effect
// are waited for.
func TestEndSessions_LoginsInALoop(t *testing.T) {
	const pw = "loop-password-1"
	svc, b, sessions := sealedBlue(t, "bgloop", pw)
	ctx, blue := context.Background(), b.base
	logins := startLogins(t, blue, pw, 16)
	logins.waitAttempts(t, 50)
	if _, err := b.endAll(ctx, sessions, blue); err != nil {
		t.Errorf("end the sessions of %s while a client logs in in a loop: %v", svc.ID, err)
	}
	logins.waitAttempts(t, 4)
	// Those in progress at the seal were ended, the others refused.
	if errs := logins.end(); int64(len(errs)) != logins.attempts.Load() {
		t.Errorf("%d of %d logins to the sealed blue failed, want all", len(errs), logins.attempts.Load())
	}
	c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable", blue.RunDir(), blue.Port, pw))
	if err == nil {
		c.Close(ctx)
	}
	if !isSwitching(err) {
		t.Errorf("a login to the sealed blue: %v, want 57P03 saying the service is switching", err)
	}
}

// TestEndSessions_LeavesLaterLogins: a login begun after the seal is not
// the switch's to end or wait for (a client connecting in a loop would
// otherwise always have one for it): left alone while it authenticates,
// it meets the seal and is refused with 57P03, not killed.
func TestEndSessions_LeavesLaterLogins(t *testing.T) {
	const pw = "later-password-1"
	svc, b, sessions := sealedBlue(t, "bglater", pw)
	ctx, blue := context.Background(), b.base
	postmaster, _ := b.rt.instances.Running(blue)
	logins, err := b.loginsInProgress(ctx, sessions, blue, postmaster)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(logins)

	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable", blue.RunDir(), blue.Port, pw))
	if err != nil {
		t.Fatal(err)
	}
	later := &gatedConn{waiting: make(chan struct{}), gate: make(chan struct{})}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		later.Conn = c
		return later, err
	}
	done := make(chan error, 1)
	go func() {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			conn.Close(ctx)
		}
		done <- err
	}()
	<-later.waiting
	if _, err := b.endSessions(ctx, sessions, logins); err != nil {
		t.Fatalf("end the sessions of %s: %v", svc.ID, err)
	}
	close(later.gate)
	if err := <-done; !isSwitching(err) {
		t.Errorf("a login begun after the seal, once the sessions were ended: %v, want refused by the seal with 57P03", err)
	}
}

// TestOpenBlue_ConnectionsFull: a tenant whose sessions fill every slot
// but the superuser-reserved ones does not make the switch fail: dbcloud
// holds sessions only on postgres and the databases with sequences
// (here tsdb, not a second database), and seals without a connection.
// With the reserved slots taken too, it fails saying what to do.
func TestOpenBlue_ConnectionsFull(t *testing.T) {
	const pw = "full-password-1"
	_, svc, b := blueBeforeSwitch(t, "bgfull", pw)
	ctx, blue := context.Background(), b.base
	mustExec(t, svc, pw, "CREATE TABLE counted (id serial PRIMARY KEY)")
	if err := b.execEach(ctx, blue, "postgres", false, "CREATE DATABASE other OWNER tsdbadmin"); err != nil {
		t.Fatal(err)
	}
	tenant := fill(t, fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable", blue.RunDir(), blue.Port, pw))
	sessions := holdBlue(t, b)
	ended, err := b.endAll(ctx, sessions, blue)
	if err != nil {
		t.Fatalf("end the sessions of %s with its connections full: %v", svc.ID, err)
	}
	if ended < tenant {
		t.Errorf("%d sessions ended, want the tenant's %d", ended, tenant)
	}
	if v, err := sessions.strings(ctx, "tsdb", "SELECT count(*)::text FROM pg_sequences"); err != nil || len(v) != 1 || v[0] != "1" {
		t.Errorf("the sequences of tsdb in the pause: %q %v, want 1", v, err)
	}
}

// TestOpenBlue_NoSlotLeft: with every connection slot taken, the reserved
// ones too, the switch fails before anything is held, with a reason the
// user can act on.
func TestOpenBlue_NoSlotLeft(t *testing.T) {
	const pw = "noslot-password-1"
	_, _, b := blueBeforeSwitch(t, "bgnoslot", pw)
	ctx, blue := context.Background(), b.base
	fill(t, fmt.Sprintf("host=%s port=%d user=tsdbadmin password=%s dbname=tsdb sslmode=disable", blue.RunDir(), blue.Port, pw))
	fill(t, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", blue.RunDir(), blue.Port))
	_, err := b.openBlue(ctx, blue)
	var f *dbcloud.UpgradeFailed
	if !errors.As(err, &f) || !strings.Contains(f.Reason, "close some sessions") {
		t.Errorf("open dbcloud's sessions with no slot left: %v, want an UpgradeFailed saying to close sessions", err)
	}
}

// fill opens sessions with dsn until the server refuses one for want of
// a slot (53300), keeps them until the test ends, and returns how many.
func fill(t *testing.T, dsn string) int {
	t.Helper()
	ctx := context.Background()
	for n := 0; ; n++ {
		c, err := pgx.Connect(ctx, dsn)
		if pgtest.SQLState(err) == "53300" {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(ctx) })
		if n > 500 {
			t.Fatal("more than 500 sessions and no refusal")
		}
	}
}

// TestWriteRootFile_NewInode: a hard link the service's OS user put in
// the data directory under the name of dbcloud's file is replaced, not
// written through: root writes only an inode it made.
func TestWriteRootFile_NewInode(t *testing.T) {
	blue := postgres.Spec{Dir: t.TempDir()}
	if err := os.Mkdir(blue.PGData(), 0o700); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(blue.PGData(), "tenant_file")
	if err := os.WriteFile(mine, []byte("the tenant's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(mine, filepath.Join(blue.PGData(), postgres.EndReasonFile)); err != nil {
		t.Fatal(err)
	}
	if err := writeRootFile(blue, postgres.EndReasonFile, "the reason\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(mine); err != nil || string(got) != "the tenant's\n" {
		t.Errorf("the file hard-linked to the reason's name: %q %v, want untouched", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(blue.PGData(), postgres.EndReasonFile)); err != nil || string(got) != "the reason\n" {
		t.Errorf("the reason file: %q %v", got, err)
	}
}

// TestGuardSeals: a process that maps the installed guard has the seal,
// even once the file was replaced (an install renames a new build over
// it); one that maps an older build, without the seal, has not, and the
// switch then seals through pg_hba.conf. Here the test process maps the
// libraries itself.
func TestGuardSeals(t *testing.T) {
	installed := "/usr/lib/postgresql/15/lib/" + postgres.GuardLibrary + ".so"
	older := "/usr/lib/postgresql/15/lib/plpgsql.so" // stands for a guard without the seal
	for _, c := range []struct {
		from string
		want bool
	}{{installed, true}, {older, false}} {
		lib, err := os.ReadFile(c.from)
		if err != nil {
			t.Skip(err)
		}
		path := filepath.Join(t.TempDir(), postgres.GuardLibrary+".so")
		if err := os.WriteFile(path, lib, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		mem, err := syscall.Mmap(int(f.Fd()), 0, len(lib), syscall.PROT_READ, syscall.MAP_PRIVATE)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if got := guardSeals(os.Getpid()); got != c.want {
			t.Errorf("a process mapping (a since deleted copy of) %s: seals %v, want %v", c.from, got, c.want)
		}
		if err := syscall.Munmap(mem); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReleaseBlue_ContinuesWhenTheSealStays: the tenant's OS user can put
// a directory where the seal goes, which root cannot remove as a file.
// The undo of a switch then fails to unseal, but blue's postmaster must
// run again all the same: held, it serves nobody, its open sessions and
// dbcloud included, for as long as every later undo fails the same way.
func TestReleaseBlue_ContinuesWhenTheSealStays(t *testing.T) {
	const pw = "stays-password-1"
	_, _, b := blueBeforeSwitch(t, "bgstays", pw)
	blue := b.base
	pid, ok := b.rt.instances.Running(blue)
	if !ok {
		t.Fatal("blue does not run")
	}
	if err := b.holdNew(pid, blue); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(blue.PGData(), postgres.SealFile)
	if err := os.MkdirAll(filepath.Join(planted, "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(planted) })
	if err := b.releaseBlue(blue); err == nil {
		t.Error("releaseBlue with a directory where the seal goes: no error, want the unseal's")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := b.rt.instances.Connect(ctx, blue, "postgres")
	if err != nil {
		t.Fatalf("dbcloud's session on blue after releaseBlue failed to unseal: %v, want the postmaster running again", err)
	}
	c.Close(ctx)
}

// TestRefuseNewDatabases: a database made on blue after the copy began
// has no subscription on green (CREATE DATABASE fires no event trigger),
// so the switch is refused before anything is paused, naming it, rather
// than failing after its whole catch-up wait with every session ended;
// and one made while the switch ended the sessions is refused too, rather
// than left behind on blue.
// Another service's cluster, with the same databases, stands in for green.
func TestRefuseNewDatabases(t *testing.T) {
	const pw = "newdb-password-1"
	rt, _, b := blueBeforeSwitch(t, "bgnewdb", pw)
	other := newTestService(t, rt, "bgnewdbg", pw, nil)
	other.Spec.PGVersion = 15
	mustEnsure(t, rt, other)
	g, err := rt.newBG(context.Background(), other, 15, 17, func(dbcloud.UpgradeStep) {})
	if err != nil {
		t.Fatal(err)
	}
	ctx, blue, green := context.Background(), b.base, g.base
	if err := b.refuseNewDatabases(ctx, blue, green); err != nil {
		t.Fatalf("blue and green with the same databases: %v, want the switch to go on", err)
	}
	if err := b.execEach(ctx, blue, "postgres", false, `CREATE DATABASE "made during the copy"`); err != nil {
		t.Fatal(err)
	}
	err = b.refuseNewDatabases(ctx, blue, green)
	var failed *dbcloud.UpgradeFailed
	if !errors.As(err, &failed) || !strings.Contains(failed.Reason, `"made during the copy"`) {
		t.Errorf("a database made on blue during the copy: %v, want an UpgradeFailed naming it", err)
	}

	// One made after the switch opened dbcloud's sessions, by a tenant's
	// session the switch then ended: the same refusal, read in dbcloud's
	// open session.
	if err := b.execEach(ctx, blue, "postgres", false, `DROP DATABASE "made during the copy"`); err != nil {
		t.Fatal(err)
	}
	sessions, err := b.openBlue(ctx, blue)
	if err != nil {
		t.Fatal(err)
	}
	defer sessions.close(ctx)
	if err := b.refuseDatabasesMadeMeanwhile(ctx, sessions, green); err != nil {
		t.Fatalf("no database made since: %v, want the switch to go on", err)
	}
	if err := b.execEach(ctx, blue, "postgres", false, `CREATE DATABASE "made while sessions ended"`); err != nil {
		t.Fatal(err)
	}
	err = b.refuseDatabasesMadeMeanwhile(ctx, sessions, green)
	if !errors.As(err, &failed) || !strings.Contains(failed.Reason, `"made while sessions ended"`) {
		t.Errorf("a database made on blue while the switch ended sessions: %v, want an UpgradeFailed naming it", err)
	}
}

// sealedBlue is blueBeforeSwitch with dbcloud's sessions on blue open and
// blue sealed, as right after the switch's seal; both undone when the
// test ends.
func sealedBlue(t *testing.T, name, pw string) (*dbcloud.Service, *bgRun, *blueSessions) {
	t.Helper()
	_, svc, b := blueBeforeSwitch(t, name, pw)
	ctx, blue := context.Background(), b.base
	t.Cleanup(func() {
		if err := b.releaseBlue(blue); err != nil {
			t.Error(err)
		}
	})
	sessions, err := b.openBlue(ctx, blue)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sessions.close(ctx) })
	if err := writeRootFile(blue, postgres.SealFile, "sealed\n"); err != nil {
		t.Fatal(err)
	}
	return svc, b, sessions
}
