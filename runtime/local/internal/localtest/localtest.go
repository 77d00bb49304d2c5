// Package localtest holds what the local runtime's tests share: a base
// directory the PostgreSQL OS user can reach, a logger into the test's
// log, and free loopback ports.
package localtest

import (
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
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

// FreePort returns a loopback port that was free a moment ago; a test that
// binds it retries on another when a parallel test took it first.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
