package pglog_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"dbcloud/pglog"
)

func TestPrune(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	type file struct {
		name string
		size int
		age  time.Duration // since its last write
	}
	const a, b, c, d = "postgresql-2026-11-20_000000.json", "postgresql-2026-11-21_000000.json", "postgresql-2026-11-22_000000.json", "postgresql-2026-11-23_000000.json"
	tests := []struct {
		name     string
		files    []file
		maxAge   time.Duration
		maxBytes int64
		want     []string // what remains
	}{
		{"KeepsYoungUnderBudget", []file{{a, 100, 3 * day}, {b, 100, 2 * day}, {c, 100, 0}}, 7 * day, 1000, []string{a, b, c}},
		{"RemovesOld", []file{{a, 100, 9 * day}, {b, 100, 8 * day}, {c, 100, 6 * day}, {d, 100, 0}}, 7 * day, 1000, []string{c, d}},
		{"KeepsFileWithALineYoungerThanMaxAge", []file{{a, 100, 7*day - time.Minute}, {b, 100, 0}}, 7 * day, 1000, []string{a, b}},
		// The newer files hold 800 bytes after the first goes: the budget
		// of 1000 keeps the second (at least 1000 bytes stay).
		{"RemovesBeyondBudget", []file{{a, 400, day}, {b, 400, day}, {c, 400, day}, {d, 400, 0}}, 7 * day, 1000, []string{b, c, d}},
		{"BudgetExactlyHeldByNewer", []file{{a, 500, day}, {b, 500, day}, {c, 500, 0}}, 7 * day, 1000, []string{b, c}},
		{"NeverTheNewest", []file{{a, 5000, 30 * day}}, 7 * day, 1000, []string{a}},
		{"NeverTheNewestOverBudget", []file{{a, 100, 30 * day}, {b, 5000, 30 * day}}, 7 * day, 1000, []string{b}},
		// Only the oldest run goes: a file that stays keeps all newer ones.
		{"StopsAtFirstKept", []file{{a, 100, 9 * day}, {b, 100, day}, {c, 100, 9 * day}, {d, 100, 0}}, 7 * day, 1000, []string{b, c, d}},
		{"ZeroBoundsOff", []file{{a, 5000, 90 * day}, {b, 5000, 0}}, 0, 0, []string{a, b}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tt.files {
				p := filepath.Join(dir, f.name)
				if err := os.WriteFile(p, []byte(strings.Repeat("x", f.size)), 0o600); err != nil {
					t.Fatal(err)
				}
				mt := now.Add(-f.age)
				if err := os.Chtimes(p, mt, mt); err != nil {
					t.Fatal(err)
				}
			}
			// Not a log the collector rotates: never touched.
			if err := os.WriteFile(filepath.Join(dir, "startup.log"), []byte(strings.Repeat("x", 9000)), 0o600); err != nil {
				t.Fatal(err)
			}
			removed, err := pglog.Prune(dir, tt.maxAge, tt.maxBytes, now)
			if err != nil {
				t.Fatal(err)
			}
			ents, _ := os.ReadDir(dir)
			var got []string
			for _, e := range ents {
				if e.Name() != "startup.log" {
					got = append(got, e.Name())
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("remaining = %v, want %v", got, tt.want)
			}
			if want := len(tt.files) - len(tt.want); removed != want {
				t.Errorf("removed = %d, want %d", removed, want)
			}
			if _, err := os.Stat(filepath.Join(dir, "startup.log")); err != nil {
				t.Errorf("startup.log: %v", err)
			}
		})
	}
	t.Run("MissingDir", func(t *testing.T) {
		if n, err := pglog.Prune(filepath.Join(t.TempDir(), "nope"), day, 1, now); n != 0 || err != nil {
			t.Errorf("Prune of a missing directory = %d, %v; want 0, nil", n, err)
		}
	})
}
