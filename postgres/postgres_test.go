package postgres_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/internal/pgtest"
	"dbcloud/postgres"
	"dbcloud/storetest"
)

// One server serves the whole package, each test a database of its own:
// starting a server takes over a second, creating a database milliseconds.
var (
	serverOnce sync.Once
	server     *pgtest.Server
	serverDir  string
	serverErr  error
	databases  atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if server != nil {
		if err := server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
		_ = os.RemoveAll(serverDir)
	}
	os.Exit(code)
}

// mustServer starts the package's server on first use. It fails tb if
// PostgreSQL cannot start: the store tests must never pass by not running.
func mustServer(tb testing.TB) *pgtest.Server {
	tb.Helper()
	serverOnce.Do(func() {
		// Not pgtest.MustStart: its cleanup would stop the server when the
		// first test ends. TestMain stops it instead.
		if serverDir, serverErr = os.MkdirTemp("", "dbcloud-pgtest-"); serverErr != nil {
			return
		}
		server, serverErr = pgtest.Start(context.Background(), serverDir)
		if serverErr != nil {
			_ = os.RemoveAll(serverDir)
		}
	})
	if serverErr != nil {
		tb.Fatalf("pgtest: %v", serverErr)
	}
	return server
}

// mustCreateDatabase returns the DSN of a new, empty database.
func mustCreateDatabase(tb testing.TB) string {
	tb.Helper()
	dsn, err := mustServer(tb).CreateDatabase(tb.Context(), fmt.Sprintf("store_%d", databases.Add(1)))
	if err != nil {
		tb.Fatal(err)
	}
	return dsn
}

func newDB(tb testing.TB) storetest.Opener {
	dsn := mustCreateDatabase(tb)
	return func(tb testing.TB) dbcloud.Store {
		tb.Helper()
		return MustOpen(tb, dsn)
	}
}

// MustOpen opens the store at dsn and closes it when tb ends.
func MustOpen(tb testing.TB, dsn string) *postgres.Store {
	tb.Helper()
	s, err := postgres.Open(tb.Context(), dsn)
	return closeAtEnd(tb, s, err)
}

// closeAtEnd returns the store s that Open returned with err, and closes
// it when tb ends.
func closeAtEnd(tb testing.TB, s *postgres.Store, err error) *postgres.Store {
	tb.Helper()
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
	t.Run("Concurrent", func(t *testing.T) {
		// Control plane replicas starting together migrate one database
		// in turn instead of failing on each other's DDL.
		dsn := mustCreateDatabase(t)
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() {
				s, err := postgres.Open(t.Context(), dsn)
				if err != nil {
					t.Errorf("Open: %v", err)
					return
				}
				_ = s.Close()
			})
		}
		wg.Wait()
	})
	t.Run("ErrDSN", func(t *testing.T) {
		// A refused connection fails Open, not the first request.
		dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/missing?sslmode=disable", mustServer(t).Port)
		if s, err := postgres.Open(t.Context(), dsn); err == nil {
			_ = s.Close()
			t.Error("Open of a missing database succeeded")
		}
	})
}

func BenchmarkStatusChange(b *testing.B) { storetest.BenchmarkStatusChange(b, newDB) }

func BenchmarkListServices(b *testing.B) { storetest.BenchmarkListServices(b, newDB) }

func BenchmarkFindService(b *testing.B) { storetest.BenchmarkFindService(b, newDB) }

func BenchmarkUpdateService(b *testing.B) { storetest.BenchmarkUpdateService(b, newDB) }

// BenchmarkUpdateServicePlanes is BenchmarkUpdateService with planes
// other than the writer open on the database ("N-other"), whose acks each
// write waits for (planes.go), beside the writer alone ("0-other"); and
// with one other plane whose follower lost its connection and cannot get
// it back ("1-other-away"), or whose follower's connection stalls without
// failing ("1-other-stalled"), which the writer need not wait for.
func BenchmarkUpdateServicePlanes(b *testing.B) {
	for _, c := range []struct {
		name    string
		others  int
		away    bool
		stalled bool
	}{{"0-other", 0, false, false}, {"1-other", 1, false, false}, {"2-other", 2, false, false},
		{"1-other-away", 1, true, false}, {"1-other-stalled", 1, false, true}} {
		b.Run(c.name, func(b *testing.B) {
			storetest.BenchmarkUpdateService(b, func(tb testing.TB) storetest.Opener {
				dsn := mustCreateDatabase(tb)
				var others []*postgres.Store
				var proxy *stallProxy
				for i := range c.others {
					if i == 0 && c.stalled {
						var o *postgres.Store
						o, proxy = mustOpenStallable(tb, dsn)
						others = append(others, o)
						continue
					}
					others = append(others, MustOpen(tb, dsn))
				}
				return func(tb testing.TB) dbcloud.Store {
					s := MustOpen(tb, dsn)
					deadline := time.Now().Add(10 * time.Second)
					for !postgres.Settled(s) && time.Now().Before(deadline) {
						time.Sleep(10 * time.Millisecond)
					}
					if c.away || c.stalled {
						if c.away {
							cutFollower(tb, others[0])
						} else {
							proxy.Stall()
							tb.Cleanup(proxy.Resume) // before the plane closes
						}
						// The steady state, if the writer ever gets there.
						for postgres.Awaits(s, postgres.PlaneID(others[0])) && time.Now().Before(deadline) {
							time.Sleep(10 * time.Millisecond)
						}
					}
					return s
				}
			})
		})
	}
}

func BenchmarkRecordHistory(b *testing.B) { storetest.BenchmarkRecordHistory(b, newDB) }

func BenchmarkQueryHistory(b *testing.B) { storetest.BenchmarkQueryHistory(b, newDB) }

// TestStore_RevisionsFromMemory: the counters every API read asks for
// need no connection of the pool once the store follows them.
func TestStore_RevisionsFromMemory(t *testing.T) {
	s := MustOpen(t, mustCreateDatabase(t))
	storetest.RevisionsFromMemory(t, s, s.ReadDB())
}

// servicesRev reads the services counter of project p1 through s.
func servicesRev(t *testing.T, s *postgres.Store) int64 {
	t.Helper()
	n, err := s.Revisions(t.Context(), dbcloud.RevisionServices("p1"))
	if err != nil {
		t.Fatalf("Revisions: %v", err)
	}
	return n[0]
}

// insertService commits a new service of project p1 through s.
func insertService(t *testing.T, s *postgres.Store, id string) {
	t.Helper()
	storetest.MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.InsertService(storetest.NewService("p1", id, time.Now())) })
}

// following counts the planes that listen and have read the counters
// since (their connection waits, idle, after that read); only the one of
// the follower connection pid unless pid is 0.
func following(t *testing.T, s *postgres.Store, pid int) int {
	t.Helper()
	var n int
	if err := s.DB().QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'dbcloud revisions'
		AND state = 'idle' AND query LIKE 'SELECT scope, rev FROM revisions%'
		AND ($1 = 0 OR pid = $1)`, pid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// awaitFollowing waits until want planes follow the counters (following).
func awaitFollowing(t *testing.T, what string, s *postgres.Store, want, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n := following(t, s, pid); n < want; n = following(t, s, pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d planes follow the counters, want %d", what, n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStore_FollowAfterReconnect: a plane whose notification connection
// is cut sees every commit another plane made meanwhile and afterwards,
// at its first read after that plane's Update returned: it reads the
// counters from the store until it listens again, then reads them all
// once.
func TestStore_FollowAfterReconnect(t *testing.T) {
	dsn := mustCreateDatabase(t)
	a, b := MustOpen(t, dsn), MustOpen(t, dsn)
	seen := func(what string, want int64) {
		t.Helper()
		if got := servicesRev(t, a); got != want {
			t.Fatalf("%s: services/p1 reads %d, want %d", what, got, want)
		}
	}
	insert := func(id string) { t.Helper(); insertService(t, b, id) }
	bothFollow := func(what string) { t.Helper(); awaitFollowing(t, what, b, 2, 0) }
	bothFollow("after Open")
	insert("s1")
	seen("before the cut", 1)
	for i := range 2 {
		if _, err := b.DB().ExecContext(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'dbcloud revisions'`); err != nil {
			t.Fatal(err)
		}
		insert(fmt.Sprintf("cut%d", i))
	}
	seen("commits while cut", 3)
	bothFollow("after the cut")
	insert("after")
	seen("a commit after the reconnect", 4)
}

// TestStore_StalledFollowerReadsTheStore: a plane whose notification
// connection stalls without failing (here a proxy stops forwarding it; a
// cut cable looks the same) answers no read from the counters it keeps,
// once another plane's write returned: the write waited until the
// stalled plane's lease ran out (and it said bye, planes.go's Mute).
// Once the connection moves again, the plane is exact as before.
func TestStore_StalledFollowerReadsTheStore(t *testing.T) {
	dsn := mustCreateDatabase(t)
	a := MustOpen(t, dsn)
	b, proxy := mustOpenStallable(t, dsn)
	// The other plane follows the counters, so keeps them in memory.
	awaitFollowing(t, "before the stall", a, 2, 0)
	insertService(t, a, "s1")
	if got := servicesRev(t, b); got != 1 {
		t.Fatalf("before the stall: services/p1 reads %d on the other plane, want 1", got)
	}
	proxy.Stall()
	t.Cleanup(proxy.Resume) // before b closes
	insertService(t, a, "s2")
	if got := servicesRev(t, b); got != 2 {
		t.Errorf("stalled follower: services/p1 reads %d on the other plane, want 2", got)
	}
	proxy.Resume()
	insertService(t, a, "s3")
	if got := servicesRev(t, b); got != 3 {
		t.Errorf("after the stall: services/p1 reads %d on the other plane, want 3", got)
	}
}

// TestStore_UnreadablePlaneMessage: a message on the planes' channel that
// a plane cannot read (a kind a later version added, or anyone's NOTIFY)
// is ignored: the plane keeps its connection, and so applies the
// notifications that follow it.
func TestStore_UnreadablePlaneMessage(t *testing.T) {
	s := MustOpen(t, mustCreateDatabase(t))
	awaitFollowing(t, "after Open", s, 1, 0)
	pid := postgres.FollowerPID(s)
	// A counter no commit made: a follower that started over reads the
	// table instead, where it is 0, and so can never answer 7.
	scope := dbcloud.RevisionServices("p2")
	tx, err := s.DB().BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	// One transaction: its notifications arrive in the order sent.
	for _, m := range []string{"x", "", "frobnicate abc 1", "beat abc", "beat abc seven", "ack abc def"} {
		if _, err := tx.ExecContext(t.Context(), `SELECT pg_notify('dbcloud_planes', $1)`, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.ExecContext(t.Context(), `SELECT pg_notify('dbcloud_revisions', $1)`, scope+" 7"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := s.Revisions(t.Context(), scope)
		if err != nil {
			t.Fatalf("Revisions: %v", err)
		}
		if n[0] == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s reads %d, want 7: the follower did not apply the notification after the unreadable ones", scope, n[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := postgres.FollowerPID(s); got != pid {
		t.Errorf("the follower reconnected (server process %d, was %d)", got, pid)
	}
}

// cutFollower ends the follower connection of plane s and keeps it from
// connecting again until reconnect runs: meanwhile s's database admits no
// new connection, and keeps those it has open (as every plane's sender
// and pool).
func cutFollower(t testing.TB, s *postgres.Store) (reconnect func()) {
	t.Helper()
	var name string
	if err := s.DB().QueryRowContext(t.Context(), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	// From another database: PostgreSQL refuses to close the one
	// connected to.
	conn, err := pgx.Connect(t.Context(), mustServer(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	allow := func(ctx context.Context, ok bool) error {
		_, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %v", pgx.Identifier{name}.Sanitize(), ok))
		return err
	}
	if err := allow(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	reconnect = func() {
		once.Do(func() {
			// Not t.Context(): also a cleanup, after it ended.
			if err := allow(context.Background(), true); err != nil {
				t.Errorf("admit connections again: %v", err)
			}
		})
	}
	t.Cleanup(reconnect)
	pid := postgres.FollowerPID(s)
	var ended bool
	if err := conn.QueryRow(t.Context(), `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&ended); err != nil || !ended {
		t.Fatalf("end the follower's server process %d: %v (ended: %v)", pid, err, ended)
	}
	return reconnect
}

// TestStore_WritesDoNotWaitForAPlaneAway: a plane whose follower lost
// its connection ("cut"), or whose follower's connection stalls without
// failing ("stalled": its sender's connection works on), says so, and
// from then on the other planes' writes do not wait for it (instead of
// their whole bound, for as long as it is away); it reads the store
// meanwhile. Once it listens (hears) again, writes wait for it again and
// it reads each of them at once, as before.
func TestStore_WritesDoNotWaitForAPlaneAway(t *testing.T) {
	for _, c := range []struct {
		name string
		away func(t *testing.T, s *postgres.Store, proxy *stallProxy) (back func())
	}{
		{"cut", func(t *testing.T, s *postgres.Store, _ *stallProxy) func() { return cutFollower(t, s) }},
		{"stalled", func(t *testing.T, _ *postgres.Store, proxy *stallProxy) func() {
			proxy.Stall()
			t.Cleanup(proxy.Resume) // before the plane closes
			return proxy.Resume
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dsn := mustCreateDatabase(t)
			a := MustOpen(t, dsn)
			b, proxy := mustOpenStallable(t, dsn)
			awaitFollowing(t, "after Open", a, 2, 0)
			plane := postgres.PlaneID(b)
			awaits := func(what string, want bool) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for postgres.Awaits(a, plane) != want {
					if time.Now().After(deadline) {
						t.Fatalf("%s: a write on one plane waits for the other: %v, want %v", what, !want, want)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			seen := func(what string, want int64) {
				t.Helper()
				if got := servicesRev(t, b); got != want {
					t.Errorf("%s: services/p1 reads %d on the other plane, want %d", what, got, want)
				}
			}
			awaits("after Open", true)
			insertService(t, a, "s1")
			seen("before", 1)

			back := c.away(t, b, proxy)
			awaits("the other plane's follower "+c.name, false)
			insertService(t, a, "s2")
			if postgres.Awaits(a, plane) {
				t.Errorf("a write while the other plane's follower is %s waited for that plane", c.name)
			}
			seen(c.name, 2)

			back()
			awaitFollowing(t, "after", a, 2, 0)
			awaits("the other plane listens again", true)
			insertService(t, a, "s3")
			seen("after", 3)
		})
	}
}
