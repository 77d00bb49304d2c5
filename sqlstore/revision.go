package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Revisions returns the change counters of scopes, in their order
// (dbcloud.Revisions). Every cached read of the API asks for them, so they
// are answered from memory whenever the Store can tell that nothing was
// committed since it read them (revisionCache), and else read in one query
// outside any transaction: a few indexed rows.
func (s *Store) Revisions(ctx context.Context, scopes ...string) ([]int64, error) {
	out, epoch, ok := s.revs.lookup(scopes)
	if ok {
		return out, nil
	}
	out, err := s.readRevisions(ctx, scopes)
	if err != nil {
		return nil, err
	}
	s.revs.fill(epoch, scopes, out)
	return out, nil
}

// readRevisions reads the counters of scopes from the database.
func (s *Store) readRevisions(ctx context.Context, scopes []string) ([]int64, error) {
	stmt, err := s.revisionStmt(ctx, len(scopes))
	if err != nil {
		return nil, err
	}
	args := make([]any, len(scopes))
	for i, sc := range scopes {
		args[i] = sc
	}
	out := make([]int64, len(scopes))
	dest := make([]any, len(scopes))
	for i := range out {
		dest[i] = &out[i]
	}
	if err := stmt.QueryRowContext(ctx, args...).Scan(dest...); err != nil {
		return nil, fmt.Errorf("read revisions: %w", err)
	}
	return out, nil
}

// revisionStmt returns the prepared query of n counters; prepared once
// (per connection, by database/sql).
func (s *Store) revisionStmt(ctx context.Context, n int) (*sql.Stmt, error) {
	s.revMu.Lock()
	defer s.revMu.Unlock()
	if stmt := s.revStmts[n]; stmt != nil {
		return stmt, nil
	}
	if n < 1 {
		return nil, fmt.Errorf("read revisions: no scope")
	}
	// One row of scalar subqueries, not WHERE scope IN (...): SQLite
	// builds a temporary index for an IN list, which cost more than the
	// lookups themselves on every request.
	one := `COALESCE((SELECT rev FROM revisions WHERE scope = ?), 0)`
	q := `SELECT ` + one + strings.Repeat(", "+one, n-1)
	stmt, err := s.readDB.PrepareContext(ctx, s.rebind(q))
	if err != nil {
		return nil, fmt.Errorf("prepare revision query: %w", s.formatError(err))
	}
	if s.revStmts == nil {
		s.revStmts = map[int]*sql.Stmt{}
	}
	s.revStmts[n] = stmt
	return stmt, nil
}

// KeepRevisionsWhile lets the Store answer Revisions from memory for as
// long as version returns what it returned when the counters were read.
// version must change with every commit to the database, through any
// connection of any process, by the time that commit is visible to a new
// read (SQLite: the header of the WAL index). ok false means it cannot
// tell, and the counters are read from the database.
//
// next, if set, reports whether after is the version one commit after
// before. The Store reads the version just before each of its write
// transactions commits, while the transaction's write lock keeps every
// other writer out, and again just after: when next says its own commit
// was the only one in between, the counters it moved are kept and the
// rest still hold, so a busy Store's own writes do not send every read
// after them to the database. The database must take a transaction's
// write lock no later than its first write (SQLite's BEGIN IMMEDIATE
// takes it at BEGIN). Call it before the Store is used.
func (s *Store) KeepRevisionsWhile(version func() (v string, ok bool), next func(before, after string) bool) {
	s.revs.mu.Lock()
	defer s.revs.mu.Unlock()
	s.revs.version, s.revs.next = version, next
}

// commit commits tx and keeps the counters it moved (bumped), for a write
// transaction also when it moved none: see KeepRevisionsWhile.
func (s *Store) commit(tx *sql.Tx, write bool, bumped map[string]int64) error {
	before, ok := "", false
	if write {
		before, ok = s.revs.beforeCommit()
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.revs.committed(bumped, before, ok)
	return nil
}

// FollowRevisions hands the Store every counter the database holds, read
// after the caller started listening for every later commit's counters,
// which it passes to NoteRevision as they come. From then on Revisions is
// answered from memory alone (a scope missing from all reads 0), until
// UnfollowRevisions.
func (s *Store) FollowRevisions(all map[string]int64) {
	s.revs.follow(all)
}

// LeaseRevisions makes the counters a follower keeps answer only within
// a lease that RenewRevisionLease extends, and not at all after each
// FollowRevisions until it is renewed: a follower whose connection stalls
// without failing (a frozen server process, a cut cable) stops answering
// from memory once the lease runs out, without having to notice the
// stall. Call it before the Store is used.
func (s *Store) LeaseRevisions() {
	s.revs.mu.Lock()
	defer s.revs.mu.Unlock()
	s.revs.leased = true
}

// RenewRevisionLease lets the counters followed answer until until (see
// LeaseRevisions). The caller renews only once every commit up to a
// moment has reached NoteRevision, and until lies at most the lease's
// length after that moment. A lease never shrinks.
func (s *Store) RenewRevisionLease(until time.Time) {
	s.revs.mu.Lock()
	defer s.revs.mu.Unlock()
	if until.After(s.revs.until) {
		s.revs.until = until
	}
}

// AfterCommit calls wait after every commit of Update that moved a change
// counter, with the moment Commit returned, before Update returns: the
// PostgreSQL store waits there until no other plane can answer from
// counters older than that commit. Call it before the Store is used.
func (s *Store) AfterCommit(wait func(committed time.Time)) {
	s.afterCommit = wait
}

// NoteRevision records a counter a commit left (a notification from
// another process, or the Store's own commit). Counters only grow, so
// an older note than what is kept changes nothing.
func (s *Store) NoteRevision(scope string, rev int64) {
	s.revs.committed(map[string]int64{scope: rev}, "", false)
}

// UnfollowRevisions says that commits may have been missed from now on
// (the listener lost its connection): Revisions reads the database again
// until the next FollowRevisions.
func (s *Store) UnfollowRevisions() {
	s.revs.unfollow()
}

// AllRevisions reads every counter in the database, for FollowRevisions.
func (s *Store) AllRevisions(ctx context.Context) (map[string]int64, error) {
	rows, err := s.readDB.QueryContext(ctx, `SELECT scope, rev FROM revisions`)
	if err != nil {
		return nil, fmt.Errorf("read revisions: %w", err)
	}
	defer rows.Close()
	all := map[string]int64{}
	for rows.Next() {
		var scope string
		var rev int64
		if err := rows.Scan(&scope, &rev); err != nil {
			return nil, fmt.Errorf("read revisions: %w", err)
		}
		all[scope] = rev
	}
	return all, rows.Err()
}

// revisionCache keeps change counters in memory, so that a cached read
// costs no store round trip while nothing changed.
//
// Why a counter kept here is never older than what a reader may see:
//   - This Store's own commits: run notes the counters the transaction
//     left right after Commit returns, before Update returns to its
//     caller, so the caller's next request reads them (read-your-writes
//     on one plane, whatever else is slow).
//   - Every process on one SQLite file (this one, dbcloud admin): version
//     changes with every commit, in the WAL index SQLite's readers
//     themselves consult, so a commit that a new read would see has
//     already made lookup drop everything kept, unless it was this Store's
//     own and the only one since the version kept (next), whose counters
//     committed then notes with the new version.
//   - Other planes on one PostgreSQL store: their commits arrive as
//     notifications (NoteRevision), a moment after the commit is
//     visible. That moment is closed by the writer, not by a query here:
//     the other plane's Update returns only once this plane has said it
//     applied the commit, or can no longer answer from memory because its
//     lease (LeaseRevisions) ran out (postgres/planes.go). So a client
//     that got its answer from one plane reads its write from any other
//     at once. While the listener is not connected nothing is trusted:
//     counters are read from the store, and after a reconnect all are
//     read again.
//
// Kept counters that are too new are harmless: what is cached under them
// was read after them (cloud's read order), so at worst a cached answer
// is thrown away once too often.
type revisionCache struct {
	mu sync.Mutex
	// version is KeepRevisionsWhile's, nil if none; ver is what it
	// returned when revs were read.
	version func() (string, bool)
	ver     string
	// next is KeepRevisionsWhile's, nil if none.
	next func(before, after string) bool
	// trusted: revs may answer. complete: revs holds every scope there is
	// (a follower loaded the whole table), so a missing one reads 0.
	trusted, complete bool
	revs              map[string]int64
	// leased: trusted answers only before until (LeaseRevisions).
	leased bool
	until  time.Time
	// epoch grows whenever revs is dropped, so that a read of the
	// database that began before is not kept after.
	epoch uint64
}

// lookup returns the counters of scopes if every one is kept and may
// answer; else ok is false and epoch is what fill needs.
func (c *revisionCache) lookup(scopes []string) (out []int64, epoch uint64, ok bool) {
	c.mu.Lock()
	version := c.version
	c.mu.Unlock()
	var v string
	vok := false
	if version != nil {
		// Read before the counters are, outside the lock: it is I/O.
		v, vok = version()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if version != nil {
		if !vok || v != c.ver {
			c.drop()
			c.ver = v
		}
		c.trusted = vok
	}
	if !c.trusted || c.leased && !time.Now().Before(c.until) {
		return nil, c.epoch, false
	}
	out = make([]int64, len(scopes))
	for i, s := range scopes {
		rev, kept := c.revs[s]
		if !kept && !c.complete {
			return nil, c.epoch, false
		}
		out[i] = rev
	}
	return out, c.epoch, true
}

// fill keeps counters read from the database at epoch, unless what was
// kept has been dropped since. A counter that reads 0 is not kept: scopes
// come from request paths (a service's own scope), and a client asking
// for made-up ones must not grow what is kept, which may go undropped for
// as long as only this Store writes (KeepRevisionsWhile's next).
func (c *revisionCache) fill(epoch uint64, scopes []string, revs []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch != c.epoch || !c.trusted {
		return
	}
	for i, s := range scopes {
		if revs[i] != 0 {
			c.keep(s, revs[i])
		}
	}
}

// beforeCommit reads the version for committed, just before a write
// transaction commits; ok is false when there is nothing to compare it
// with afterwards.
func (c *revisionCache) beforeCommit() (before string, ok bool) {
	c.mu.Lock()
	version, next := c.version, c.next
	c.mu.Unlock()
	if version == nil || next == nil {
		return "", false
	}
	return version()
}

// committed keeps the counters a commit of this Store left. With a
// version the commit moved it, so what is kept is dropped at the next
// lookup, unless before (from beforeCommit, ok) is the version kept and
// the version now is the one commit after it: then nothing but this
// commit happened since the counters kept were right, and its counters
// are kept with the new version. Reading the version now, after the write
// lock is gone, may find later commits of other processes too; next then
// says no. A note from elsewhere (NoteRevision, ok false) keeps nothing
// when there is a version: arriving after a later commit's drop, it would
// keep a counter older than that commit's.
func (c *revisionCache) committed(revs map[string]int64, before string, ok bool) {
	c.mu.Lock()
	version := c.version
	c.mu.Unlock()
	if version == nil {
		if len(revs) == 0 {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for s, rev := range revs {
			c.keep(s, rev)
		}
		return
	}
	if !ok {
		return
	}
	// Outside the lock, as in lookup.
	after, aok := version()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !aok || !c.trusted || c.ver != before || !c.next(before, after) {
		return
	}
	c.ver = after
	for s, rev := range revs {
		c.keep(s, rev)
	}
}

func (c *revisionCache) keep(scope string, rev int64) {
	if c.revs == nil {
		c.revs = map[string]int64{}
	}
	if old, kept := c.revs[scope]; !kept || rev > old {
		c.revs[scope] = rev
	}
}

func (c *revisionCache) follow(all map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop()
	c.revs = all
	c.trusted, c.complete = true, true
	// A lease held before the follower lost its connection says nothing
	// of what was committed while it was gone: the next renewal will.
	c.until = time.Time{}
}

func (c *revisionCache) unfollow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop()
	c.trusted = false
}

// drop forgets every counter kept.
func (c *revisionCache) drop() {
	c.revs, c.complete = nil, false
	c.epoch++
}
