package postgres

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRateLog: a stream of warnings nobody can act on one by one is
// logged once per period, and the next line says how many were left out.
func TestRateLog(t *testing.T) {
	var out bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&out, nil))
	r := rateLog{every: time.Hour}
	for range 3 {
		r.warn(logger, "ignored")
	}
	if n := strings.Count(out.String(), "ignored"); n != 1 {
		t.Fatalf("3 warnings within a period logged %d times, want once:\n%s", n, out.String())
	}
	r.last = time.Now().Add(-r.every) // the period is over
	r.warn(logger, "ignored")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "not_logged=2") {
		t.Fatalf("after the period: logged\n%s\nwant a second line with not_logged=2", out.String())
	}
}
