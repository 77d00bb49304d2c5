package pgtest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud/internal/pgtest"
)

func mustConnect(tb testing.TB, dsn string) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatalf("connect %s: %v", dsn, err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestBinDir(t *testing.T) {
	t.Run("Env", func(t *testing.T) {
		t.Setenv(pgtest.EnvBinDir, "/opt/pg/bin")
		if got, want := pgtest.BinDir(), "/opt/pg/bin"; got != want {
			t.Errorf("BinDir() = %q, want %q", got, want)
		}
	})
	t.Run("Default", func(t *testing.T) {
		t.Setenv(pgtest.EnvBinDir, "")
		got := pgtest.BinDir()
		if _, err := os.Stat(filepath.Join(got, "initdb")); err != nil {
			t.Errorf("BinDir() = %q has no initdb: %v", got, err)
		}
	})
}

func TestStart(t *testing.T) {
	ctx := context.Background()
	s := pgtest.MustStart(t)

	t.Run("OK", func(t *testing.T) {
		conn := mustConnect(t, s.DSN)
		if _, err := conn.Exec(ctx, `CREATE TABLE item (id int PRIMARY KEY, name text NOT NULL)`); err != nil {
			t.Fatalf("create table: %v", err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO item VALUES (1, 'one'), (2, 'two')`); err != nil {
			t.Fatalf("insert: %v", err)
		}
		rows, err := conn.Query(ctx, `SELECT name FROM item ORDER BY id`)
		if err != nil {
			t.Fatalf("select: %v", err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("collect: %v", err)
		}
		if want := []string{"one", "two"}; !slices.Equal(got, want) {
			t.Errorf("names = %v, want %v", got, want)
		}
	})

	t.Run("Settings", func(t *testing.T) {
		conn := mustConnect(t, s.DSN)
		for name, want := range map[string]string{
			"fsync":            "off",
			"listen_addresses": "127.0.0.1",
			"server_encoding":  "UTF8",
			"lc_collate":       "C",
		} {
			var got string
			if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got); err != nil {
				t.Fatalf("current_setting(%s): %v", name, err)
			}
			if got != want {
				t.Errorf("%s = %q, want %q", name, got, want)
			}
		}
	})

	t.Run("CreateDatabase", func(t *testing.T) {
		dsnA, err := s.CreateDatabase(ctx, "store_a")
		if err != nil {
			t.Fatalf("CreateDatabase(store_a): %v", err)
		}
		// A name that needs quoting proves the identifier is escaped.
		dsnB, err := s.CreateDatabase(ctx, `Store "B"`)
		if err != nil {
			t.Fatalf(`CreateDatabase(Store "B"): %v`, err)
		}
		a, b := mustConnect(t, dsnA), mustConnect(t, dsnB)

		var gotName string
		if err := b.QueryRow(ctx, "SELECT current_database()").Scan(&gotName); err != nil {
			t.Fatal(err)
		}
		if want := `Store "B"`; gotName != want {
			t.Errorf("current_database() = %q, want %q", gotName, want)
		}
		if _, err := a.Exec(ctx, `CREATE TABLE only_in_a (id int)`); err != nil {
			t.Fatalf("create table in a: %v", err)
		}
		var found bool
		if err := b.QueryRow(ctx, `SELECT to_regclass('only_in_a') IS NOT NULL`).Scan(&found); err != nil {
			t.Fatal(err)
		}
		if found {
			t.Errorf("table created in store_a is visible in Store \"B\"; want isolated databases")
		}
	})

	t.Run("ErrCreateDatabaseExists", func(t *testing.T) {
		if _, err := s.CreateDatabase(ctx, "dup"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateDatabase(ctx, "dup"); err == nil {
			t.Errorf("second CreateDatabase(dup): got nil error, want error")
		}
	})
}

func TestServer_Stop(t *testing.T) {
	dir, err := os.MkdirTemp("", "dbcloud-pgtest-stop-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	s, err := pgtest.Start(context.Background(), dir)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := syscall.Kill(s.PID, 0); err != nil {
		t.Fatalf("postmaster pid %d not running after Start: %v", s.PID, err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}

	// Stop reaps the child, so ESRCH should be immediate; poll anyway so a
	// slow kernel does not make the test flaky.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := syscall.Kill(s.PID, 0)
		if errors.Is(err, syscall.ESRCH) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kill(%d, 0) = %v after Stop, want ESRCH", s.PID, err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v, want nil", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, s.DSN); err == nil {
		conn.Close(ctx)
		t.Errorf("connect after Stop succeeded, want error")
	}
}

// TestStart_NestedTempDir covers a caller passing a path under t.TempDir(),
// whose ancestors are 0700: under root, Start must let the postgres user
// traverse them.
func TestStart_NestedTempDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "pg")
	s, err := pgtest.Start(context.Background(), dir)
	if err != nil {
		t.Fatalf("Start(%s): %v", dir, err)
	}
	defer func() {
		if err := s.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	conn := mustConnect(t, s.DSN)
	var one int
	if err := conn.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("SELECT 1: %v", err)
	}
	if got, want := s.Dir, dir; got != want {
		t.Errorf("Dir = %q, want %q", got, want)
	}
}

func TestStart_ErrBadBinDir(t *testing.T) {
	t.Setenv(pgtest.EnvBinDir, t.TempDir())
	if _, err := pgtest.Start(context.Background(), t.TempDir()); err == nil {
		t.Errorf("Start with empty bin dir: got nil error, want error")
	}
}

// BenchmarkStart measures initdb plus postmaster startup, the cost each
// test package pays for a real database. Stop is excluded from the timing.
// It also reports the median, which is steadier than the mean on a busy CI
// machine.
func BenchmarkStart(b *testing.B) {
	var durations []time.Duration
	for b.Loop() {
		b.StopTimer()
		dir, err := os.MkdirTemp("", "dbcloud-pgtest-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		start := time.Now()
		s, err := pgtest.Start(context.Background(), dir)
		if err != nil {
			b.Fatalf("Start: %v", err)
		}
		durations = append(durations, time.Since(start))

		b.StopTimer()
		if err := s.Stop(); err != nil {
			b.Errorf("Stop: %v", err)
		}
		os.RemoveAll(dir)
		b.StartTimer()
	}
	slices.Sort(durations)
	if n := len(durations); n > 0 {
		b.ReportMetric(float64(durations[n/2].Milliseconds()), "median-ms/start")
	}
}
