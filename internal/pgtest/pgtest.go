// Package pgtest starts throwaway PostgreSQL servers for tests.
//
// Store conformance tests must run against a real PostgreSQL in CI, not be
// skipped when nobody set up a database, so tests start their own server from
// the host's PostgreSQL binaries. The server is tuned for speed over safety
// (fsync off, no full page writes): its data is discarded after the test.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud/internal/pgbin"
	"dbcloud/internal/testports"
)

// EnvBinDir names the environment variable that overrides BinDir, for hosts
// whose PostgreSQL is not installed in the Debian layout.
const EnvBinDir = "DBCLOUD_PG_BIN_DIR"

// osUser is the unprivileged account PostgreSQL runs as when tests run as
// root; initdb and postgres both refuse to run as root.
const osUser = "postgres"

const (
	// readyTimeout bounds how long Start waits for a server to accept
	// queries; a cold start on a loaded CI machine takes a few seconds.
	readyTimeout = 30 * time.Second
	// pollInterval is short because startup takes tens of milliseconds
	// once initdb is done, and every test pays for the wait.
	pollInterval = 5 * time.Millisecond
	// portAttempts covers the race between picking a free port and the
	// postmaster binding it, when parallel test binaries pick the same one.
	portAttempts = 3
	// stopTimeout is how long a fast shutdown may take before SIGKILL.
	stopTimeout = 10 * time.Second
)

// BinDir returns the directory holding initdb and postgres: $DBCLOUD_PG_BIN_DIR
// if set, else /usr/lib/postgresql/15/bin (the version the product targets),
// else the highest installed /usr/lib/postgresql/N/bin, else the directory of
// initdb on $PATH. If nothing is found it returns the 15 path so that the
// error from Start names a concrete place to look.
func BinDir() string { return pgbin.Dir() }

// Server is a running PostgreSQL started by Start. DSN connects as the
// superuser "postgres" (trust auth, loopback only) to database "postgres".
type Server struct {
	DSN  string
	Port int
	Dir  string
	PID  int

	cmd      *exec.Cmd
	exited   chan struct{} // closed when cmd.Wait returns
	waitErr  error         // valid after exited is closed
	stopOnce sync.Once
	stopErr  error
}

// Start initialises a cluster in dir/data and runs a postmaster on a free
// loopback port until Stop. The caller owns dir; Start creates it if needed.
//
// Layout: dir/data (cluster), dir/sock (Unix socket, kept out of /tmp so
// parallel servers never share a lock file), dir/postgres.log (server
// stderr, outside the data directory so it survives a failed initdb).
func Start(ctx context.Context, dir string) (*Server, error) {
	bin := BinDir()
	if fi, err := os.Stat(filepath.Join(bin, "initdb")); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("start postgres: initdb not found in %s; install postgresql-15 or set %s", bin, EnvBinDir)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	if err := prepareDir(dir, cred); err != nil {
		return nil, fmt.Errorf("start postgres in %s: %w", dir, err)
	}

	dataDir := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-N", "-A", "trust", "-U", "postgres", "-D", dataDir,
		"--encoding=UTF8", "--locale=C")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb %s: %w\n%s", dataDir, err, out)
	}

	logPath := filepath.Join(dir, "postgres.log")
	var lastErr error
	for attempt := 1; attempt <= portAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("start postgres: %w", err)
		}
		s, err := startPostmaster(ctx, bin, dir, logPath, port, cred)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if !errors.Is(err, errPortInUse) {
			break
		}
	}
	return nil, fmt.Errorf("start postgres in %s: %w (log: %s)", dir, lastErr, logPath)
}

// errPortInUse marks a postmaster that exited because another process took
// its port between freePort and bind; Start retries with a new port.
var errPortInUse = errors.New("port already in use")

func startPostmaster(ctx context.Context, bin, dir, logPath string, port int, cred *syscall.Credential) (*Server, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer logFile.Close() // the child holds its own descriptor
	logStart, err := logFile.Seek(0, 2)
	if err != nil {
		return nil, fmt.Errorf("seek log: %w", err)
	}

	// Not exec.CommandContext: the server must outlive Start's ctx.
	cmd := exec.Command(filepath.Join(bin, "postgres"),
		"-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+filepath.Join(dir, "sock"),
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=100",
		"-c", "shared_buffers=32MB",
	)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Own process group: a Ctrl-C aimed at `go test` must not reach the
	// postmaster before Stop does, and Stop can reap stray backends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("run postgres: %w", err)
	}
	s := &Server{
		DSN:    fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		Port:   port,
		Dir:    dir,
		PID:    cmd.Process.Pid,
		cmd:    cmd,
		exited: make(chan struct{}),
	}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()

	if err := s.waitReady(ctx); err != nil {
		_ = s.Stop()
		if portTaken(logPath, logStart) {
			return nil, fmt.Errorf("port %d: %w", port, errPortInUse)
		}
		return nil, err
	}
	return s, nil
}

// waitReady polls until a TCP connection can run SELECT 1. It checks TCP,
// not the Unix socket, because TCP is what tests use and listen_addresses
// is the part most likely to fail.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	var lastErr error
	for {
		err := ping(ctx, s.DSN)
		if err == nil {
			return nil
		}
		lastErr = err
		select {
		case <-s.exited:
			return fmt.Errorf("postgres (pid %d) exited during startup: %v", s.PID, s.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("postgres (pid %d) not ready: %w (last error: %v)", s.PID, ctx.Err(), lastErr)
		case <-ticker.C:
		}
	}
}

func ping(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// portTaken reports whether the log written since offset shows a bind
// failure, the only startup failure worth retrying.
func portTaken(logPath string, offset int64) bool {
	f, err := os.Open(logPath)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		return false
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(f); err != nil {
		return false
	}
	log := buf.String()
	return strings.Contains(log, "could not bind") || strings.Contains(log, "Address already in use")
}

// freePort returns a loopback port no other test on this machine holds.
func freePort() (int, error) { return testports.Port() }

// serverCredential returns the identity to run PostgreSQL as: nil (the
// current user) normally, or the "postgres" OS user when running as root,
// because initdb and postgres refuse to run as root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(osUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, so PostgreSQL must run as OS user %q, but looking it up failed: %w (create it, e.g. `useradd --system %s`, or run the tests as a non-root user)", osUser, err, osUser)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse uid %q of user %q: %w", u.Uid, osUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse gid %q of user %q: %w", u.Gid, osUser, err)
	}
	// Groups is empty on purpose: setgroups([]) drops root's supplementary
	// groups, so the server gets no access beyond its own uid and gid.
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// prepareDir creates dir (0755), dir/sock (0755) and dir/data (0700, as
// initdb requires) and, when PostgreSQL runs as another user, hands dir/data
// and dir/sock to that user.
//
// Running as root adds one problem: the postgres user must be able to
// traverse every ancestor of dir, and test temp directories are 0700 root
// (t.TempDir is /tmp/TestX123/001, both levels 0700). Rather than asking
// every caller to get this right, prepareDir grants search permission (o+x
// only: names can be resolved but not listed) on ancestors that we own and
// that lie strictly inside os.TempDir(), which is scratch space we are
// entitled to change. Anything else it refuses with an error naming the
// directory, rather than loosening permissions on, say, /root.
func prepareDir(dir string, cred *syscall.Credential) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// MkdirAll leaves an existing dir's mode alone (os.MkdirTemp makes 0700).
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for _, sub := range []struct {
		name string
		perm os.FileMode
	}{{"sock", 0o755}, {"data", 0o700}} {
		p := filepath.Join(dir, sub.name)
		if err := os.Mkdir(p, sub.perm); err != nil {
			return err
		}
		if cred != nil {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return err
			}
		}
	}
	if cred == nil {
		return nil
	}
	return ensureTraversable(dir, cred)
}

// ensureTraversable makes sure cred can reach dir; see prepareDir.
func ensureTraversable(dir string, cred *syscall.Credential) error {
	tmp, err := filepath.Abs(os.TempDir())
	if err != nil {
		return err
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("stat %s: no owner information", p)
		}
		if !canTraverse(fi.Mode(), st, cred) {
			insideTmp := strings.HasPrefix(p, tmp+string(filepath.Separator))
			if !insideTmp || int(st.Uid) != os.Geteuid() {
				return fmt.Errorf("OS user %q (uid %d) cannot traverse %s (mode %v); use a directory under %s",
					osUser, cred.Uid, p, fi.Mode().Perm(), tmp)
			}
			if err := os.Chmod(p, fi.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("allow OS user %q to traverse %s: %w", osUser, p, err)
			}
		}
		if parent := filepath.Dir(p); parent == p {
			return nil
		}
	}
}

func canTraverse(mode os.FileMode, st *syscall.Stat_t, cred *syscall.Credential) bool {
	switch {
	case st.Uid == cred.Uid:
		return mode&0o100 != 0
	case st.Gid == cred.Gid:
		return mode&0o010 != 0
	default:
		return mode&0o001 != 0
	}
}

// CreateDatabase creates an empty database and returns a DSN for it, so
// tests sharing one server stay isolated from each other.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		return "", fmt.Errorf("create database %q: connect: %w", name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %q: %w", name, err)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)),
		Path:     "/" + name,
		RawQuery: "sslmode=disable",
	}
	return u.String(), nil
}

// Stop shuts the server down and reaps it. It sends SIGINT (PostgreSQL's
// fast shutdown: abort transactions, checkpoint, exit) to the postmaster's
// PID, and after stopTimeout SIGKILLs the postmaster and its process group,
// which holds only processes this server started. It never kills by name, so
// other PostgreSQL servers on the host are safe. Stop is idempotent.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Server) stop() error {
	select {
	case <-s.exited:
		return nil
	default:
	}
	if err := syscall.Kill(s.PID, syscall.SIGINT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop postgres (pid %d): %w", s.PID, err)
	}
	select {
	case <-s.exited:
		return nil
	case <-time.After(stopTimeout):
	}
	// The postmaster is its group's leader (Setpgid), so -PID is exactly
	// this server's process group.
	_ = syscall.Kill(-s.PID, syscall.SIGKILL)
	if err := syscall.Kill(s.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill postgres (pid %d): %w", s.PID, err)
	}
	<-s.exited
	return fmt.Errorf("stop postgres (pid %d): no exit within %v of fast shutdown, killed", s.PID, stopTimeout)
}

// MustStart starts a server in a fresh temporary directory and stops and
// removes it when the test ends. It fails the test rather than skipping it
// when PostgreSQL is unavailable: CI must never pass by not running the
// store tests.
//
// The directory comes from os.MkdirTemp, not tb.TempDir, so that it sits
// directly in os.TempDir() and, under root, no ancestor needs its
// permissions changed.
func MustStart(tb testing.TB) *Server {
	tb.Helper()
	dir, err := os.MkdirTemp("", "dbcloud-pgtest-")
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	s, err := Start(context.Background(), dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("pgtest: remove %s: %v", dir, err)
		}
	})
	return s
}
