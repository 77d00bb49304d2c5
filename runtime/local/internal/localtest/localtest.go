// Package localtest holds what the local runtime's tests share: a base
// directory the PostgreSQL OS user can reach, a logger into the test's
// log, and free loopback ports.
package localtest

import (
	"log/slog"
	"os"
	"strings"
	"testing"

	"dbcloud/internal/testports"
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
