package postgres

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"dbcloud/runtime/local/internal/localtest"
)

// The tests below play a tenant with a shell as its service's OS user, who
// owns the data directory and the log directory, against what dbcloud does
// there as root.

const victimText = "root only: must never change\n"

// tenantInstance makes an instance directory as the runtime lays it out:
// the instance root root's, pgdata and log owned by a real service
// identity; and a root-only victim file beside it.
func tenantInstance(t *testing.T) (s Spec, victim string, as func(dir, script string)) {
	t.Helper()
	id := localtest.ServiceUser(t)
	base := localtest.Base(t)
	s = Spec{ID: "tenant", Dir: filepath.Join(base, "inst"), Owner: &id}
	if err := os.Mkdir(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{s.PGData(), s.LogDir()} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, int(id.UID), int(id.GID)); err != nil {
			t.Fatal(err)
		}
	}
	victim = filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte(victimText), 0o600); err != nil {
		t.Fatal(err)
	}
	return s, victim, func(dir, script string) { localtest.AsUser(t, id, "cd "+dir+"; "+script) }
}

func checkVictim(t *testing.T, victim string) {
	t.Helper()
	got, err := os.ReadFile(victim)
	if err != nil || string(got) != victimText {
		t.Errorf("root-only victim now %q, %v; want it unchanged", got, err)
	}
}

// within runs fn, failing the test if it has not returned within a bound
// (a read blocked on a FIFO never returns by itself).
func within[T any](t *testing.T, what string, fn func() T) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan T, 1)
	go func() { done <- fn() }()
	select {
	case v := <-done:
		return v
	case <-ctx.Done():
		t.Fatalf("%s still blocked: %v", what, ctx.Err())
		panic("unreachable")
	}
}

// A FIFO named postmaster.pid blocked the health loop's read for minutes
// while the service showed READY: the one reader of that file answers an
// error at once.
func TestReadPidFile_FIFO(t *testing.T) {
	s, _, as := tenantInstance(t)
	as(s.PGData(), "mkfifo postmaster.pid")
	err := within(t, "ReadPidFile on a FIFO", func() error { _, err := ReadPidFile(s.PGData()); return err })
	t.Logf("ReadPidFile: %v", err)
	if err == nil {
		t.Fatal("ReadPidFile(FIFO): no error")
	}
	// The health loop's question: no postmaster serves it, answered now.
	if within(t, "Live on a FIFO", func() bool { _, ok := (&Instances{}).Live(s); return ok }) {
		t.Error("Live(FIFO as postmaster.pid) = true")
	}
}

// A postmaster.pid linked to a file of root's is not read through the link.
func TestReadPidFile_Link(t *testing.T) {
	s, victim, as := tenantInstance(t)
	if err := os.WriteFile(victim, []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	as(s.PGData(), "ln -s "+victim+" postmaster.pid")
	if pf, err := ReadPidFile(s.PGData()); err == nil {
		t.Fatalf("ReadPidFile through a link = %+v, want an error", pf)
	}
}

// standby.signal linked to a path of root's choosing must not make root
// create (or truncate) the file there.
func TestWriteStandbySignal_Link(t *testing.T) {
	s, victim, as := tenantInstance(t)
	created := filepath.Join(filepath.Dir(victim), "created-by-root")
	as(s.PGData(), "ln -s "+created+" standby.signal")
	err := (&Instances{Logger: slog.New(slog.DiscardHandler)}).WriteStandbySignal(s)
	t.Logf("WriteStandbySignal: %v", err)
	if _, serr := os.Lstat(created); serr == nil {
		t.Fatalf("root created %s through the tenant's link", created)
	}
	if err == nil {
		t.Error("WriteStandbySignal over a link: no error")
	}
}

// pg_rewind's setting is appended to the data directory's postgresql.conf,
// never to what a link there names.
func TestRewind_ConfLink(t *testing.T) {
	s, victim, as := tenantInstance(t)
	as(s.PGData(), "ln -s "+victim+" postgresql.conf")
	m := &Instances{Logger: slog.New(slog.DiscardHandler), BinDir: "/nonexistent"}
	err := m.Rewind(context.Background(), Spec{ID: "primary", Dir: t.TempDir()}, s)
	t.Logf("Rewind: %v", err)
	checkVictim(t, victim)
}

// The start-failure report reads the server's JSON logs: a FIFO there must
// not hang the start, and a link must not bring a root file's lines into
// the error message.
func TestServerErrors_TenantFiles(t *testing.T) {
	s, victim, as := tenantInstance(t)
	secret := `{"timestamp":"2099-01-01 00:00:00.000 UTC","error_severity":"ERROR","state_code":"XX000","message":"root secret"}` + "\n"
	if err := os.WriteFile(victim, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Minute)
	as(s.LogDir(), "mkfifo postgresql-2026-01-01_000000.json; ln -s "+victim+" postgresql-2026-01-02_000000.json")
	got := within(t, "serverErrors with a FIFO", func() string { return serverErrors(s.LogDir(), since) })
	if strings.Contains(got, "root secret") {
		t.Errorf("serverErrors = %q: read a root file through the tenant's link", got)
	}
}

// A link in place of the server's socket would make dbcloud's superuser
// connection reach the socket it names (another service's server, where
// peer identity makes root its superuser): Connect never follows it.
func TestConnect_SocketLink(t *testing.T) {
	s, victim, as := tenantInstance(t)
	s.Port = 5432
	run := s.RunDir()
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(run, int(s.Owner.UID), int(s.Owner.GID)); err != nil {
		t.Fatal(err)
	}
	// Another service's socket, in a directory only root reaches.
	other := filepath.Join(filepath.Dir(victim), "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(other, ".s.PGSQL.5432"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Connect fails only once the accepted connection is closed, after
	// the accept was recorded: the check below needs no waiting.
	reached := make(chan struct{}, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			reached <- struct{}{}
			c.Close()
		}
	}()
	as(run, "ln -s "+filepath.Join(other, ".s.PGSQL.5432")+" .s.PGSQL.5432")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := (&Instances{}).Connect(ctx, s, "postgres")
	if err == nil {
		conn.Close(ctx)
	}
	t.Logf("Connect: %v", err)
	select {
	case <-reached:
		t.Fatal("the superuser connection reached the socket the tenant's link names")
	default:
	}
	if err == nil {
		t.Error("Connect through a link: no error")
	}
}
