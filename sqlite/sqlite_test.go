package sqlite_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/sqlite"
	"dbcloud/storetest"
)

// newDB gives each test its own database file in a temporary directory.
func newDB(tb testing.TB) storetest.Opener {
	path := filepath.Join(tb.TempDir(), "dbcloud.db")
	return func(tb testing.TB) dbcloud.Store {
		tb.Helper()
		return MustOpen(tb, path)
	}
}

// MustOpen opens the store at path and closes it when tb ends.
func MustOpen(tb testing.TB, path string) *sqlite.Store {
	tb.Helper()
	s, err := sqlite.Open(tb.Context(), path)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestStore(t *testing.T) {
	storetest.RunStoreTests(t, newDB)
}

func TestOpen(t *testing.T) {
	t.Run("WAL", func(t *testing.T) {
		s := MustOpen(t, filepath.Join(t.TempDir(), "db"))
		var mode string
		if err := s.DB().QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if mode != "wal" {
			t.Errorf("journal_mode = %q, want wal", mode)
		}
	})
	t.Run("SynchronousNormal", func(t *testing.T) {
		// Commits write the WAL without syncing it; Update then waits for
		// a sync of the WAL shared with the commits made meanwhile (group
		// commit, durable_test.go), so no writer waits on another's fsync.
		s := MustOpen(t, filepath.Join(t.TempDir(), "db"))
		var sync int
		if err := s.DB().QueryRowContext(t.Context(), "PRAGMA synchronous").Scan(&sync); err != nil {
			t.Fatal(err)
		}
		if sync != 1 {
			t.Errorf("synchronous = %d, want 1 (NORMAL)", sync)
		}
	})
	t.Run("ErrPath", func(t *testing.T) {
		for _, path := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro"} {
			if s, err := sqlite.Open(t.Context(), path); err == nil {
				_ = s.Close()
				t.Errorf("Open(%q) succeeded, want an error", path)
			}
		}
	})
	t.Run("ErrNewerSchema", func(t *testing.T) {
		// A database migrated by a newer binary is refused, not misread.
		path := filepath.Join(t.TempDir(), "db")
		s := MustOpen(t, path)
		if _, err := s.DB().ExecContext(t.Context(),
			`INSERT INTO schema_migrations (version, applied) VALUES (9999, 'future')`); err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
		s2, err := sqlite.Open(t.Context(), path)
		if err == nil {
			_ = s2.Close()
			t.Fatal("Open of a newer schema succeeded")
		}
		if !strings.Contains(err.Error(), "9999") {
			t.Errorf("Open error %q does not name the schema version", err)
		}
	})
}

func BenchmarkStatusChange(b *testing.B) { storetest.BenchmarkStatusChange(b, newDB) }

func BenchmarkListServices(b *testing.B) { storetest.BenchmarkListServices(b, newDB) }

func BenchmarkFindService(b *testing.B) { storetest.BenchmarkFindService(b, newDB) }

func BenchmarkUpdateService(b *testing.B) { storetest.BenchmarkUpdateService(b, newDB) }

func BenchmarkRecordHistory(b *testing.B) { storetest.BenchmarkRecordHistory(b, newDB) }

func BenchmarkQueryHistory(b *testing.B) { storetest.BenchmarkQueryHistory(b, newDB) }

func TestOpen_PrivateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600: it holds key hashes and verifiers", p, fi.Mode().Perm())
		}
	}
}

// A full disk refuses the write whole, as a 503 the client can retry
// (ErrStoreFull), keeps reads answering, and writes resume once there is
// room. max_page_count makes SQLite answer exactly as it does on ENOSPC
// (SQLITE_FULL), without filling a real disk.
func TestDiskFull(t *testing.T) {
	s := MustOpen(t, filepath.Join(t.TempDir(), "db"))
	ctx := t.Context()
	insert := func(ids ...string) error {
		return s.Update(ctx, func(tx dbcloud.Tx) error {
			for _, id := range ids {
				p := &dbcloud.Project{ID: id, Name: strings.Repeat(id, 2000/len(id)), PlanType: "FREE", Created: time.Now()}
				if err := tx.InsertProject(p); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := insert("p0"); err != nil {
		t.Fatal(err)
	}
	// The one write connection: the limit applies to every write.
	var pages int
	if err := s.DB().QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages)); err != nil {
		t.Fatal(err)
	}
	var many []string
	for i := range 200 {
		many = append(many, fmt.Sprintf("p%d", i+1))
	}
	err := insert(many...)
	if !errors.Is(err, dbcloud.ErrStoreFull) || dbcloud.ErrorKindOf(err) != dbcloud.KindUnavailable {
		t.Fatalf("write on a full disk: %v, want ErrStoreFull (unavailable)", err)
	}
	var projects []*dbcloud.Project
	if err := s.View(ctx, func(tx dbcloud.Tx) (err error) { projects, err = tx.ListProjects(); return err }); err != nil {
		t.Fatalf("read on a full disk: %v", err)
	}
	if len(projects) != 1 {
		t.Fatalf("%d projects after a refused write, want the 1 from before", len(projects))
	}
	if _, err := s.DB().ExecContext(ctx, "PRAGMA max_page_count = 1073741823"); err != nil {
		t.Fatal(err)
	}
	if err := insert(many...); err != nil {
		t.Fatalf("write once there is room: %v", err)
	}
}

// BenchmarkUpdate_Concurrent runs small write transactions from 32
// goroutines per CPU at once, and reports their p99: with group commit they
// share fsyncs instead of queueing one behind another's.
func BenchmarkUpdate_Concurrent(b *testing.B) {
	s := MustOpen(b, filepath.Join(b.TempDir(), "db"))
	var n atomic.Int64
	var mu sync.Mutex
	var took []time.Duration
	b.SetParallelism(32) // × GOMAXPROCS goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := fmt.Sprintf("p%d", n.Add(1))
			start := time.Now()
			err := s.Update(b.Context(), func(tx dbcloud.Tx) error {
				return tx.InsertProject(&dbcloud.Project{ID: id, Name: id, PlanType: "FREE", Created: time.Now()})
			})
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			took = append(took, time.Since(start))
			mu.Unlock()
		}
	})
	b.StopTimer()
	slices.Sort(took)
	if len(took) > 0 {
		b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
	}
}

// TestStore_RevisionsFromMemory: the counters every API read asks for
// need no connection of the read pool while nothing was committed.
func TestStore_RevisionsFromMemory(t *testing.T) {
	s := MustOpen(t, filepath.Join(t.TempDir(), "dbcloud.db"))
	storetest.RevisionsFromMemory(t, s, s.ReadDB())
}
