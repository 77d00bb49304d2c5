// Package localtest holds what the local runtime's tests share: a base
// directory the PostgreSQL OS user can reach, a logger into the test's
// log, and free loopback ports.
package localtest

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"dbcloud/internal/testports"
	"dbcloud/runtime/local/internal/osuser"
)

// Base returns a fresh directory directly in os.TempDir() (whose ancestors
// the postgres user can traverse), made traversable itself, and removed at
// the end of the test.
func Base(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "dbcloud-local-")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Helper()
	w.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Logger writes Info and above into the test's log.
func Logger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// FreePort returns a loopback port that no other test on this machine
// holds (see testports).
func FreePort(tb testing.TB) int {
	tb.Helper()
	return testports.MustPort(tb)
}

// ServiceUser makes a real OS identity, as a service gets one (useradd
// through osuser), removed at the end of the test. Tests that play a
// tenant with a shell act as it through AsUser. It skips without root.
func ServiceUser(tb testing.TB) osuser.Identity {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("making an OS user needs root")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		tb.Skip("setpriv is not installed")
	}
	m := osuser.New(osuser.DefaultPrefix, osuser.SystemTools(), Logger(tb))
	ctx := context.Background()
	key := "t" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	id, err := m.Ensure(ctx, key)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := m.Remove(ctx, key); err != nil {
			tb.Errorf("remove OS user %s: %v", id.Name, err)
		}
	})
	return id
}

// AsUser runs a shell script as id (its uid and gid, no supplementary
// group), as a tenant's shell would, and fails the test if it fails.
func AsUser(tb testing.TB, id osuser.Identity, script string) {
	tb.Helper()
	cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(int(id.UID)), "--regid="+strconv.Itoa(int(id.GID)),
		"--clear-groups", "/bin/sh", "-ec", script)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("as %s: %s: %v: %s", id.Name, script, err, out)
	}
}
