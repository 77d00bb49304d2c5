package e2e

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/internal/chaos"
	"dbcloud/internal/pgtest"
)

// A tenant writes past its storage limit at a moment of each round.
var chaosQuotaRounds = flag.Int("chaos.quota.rounds", 2, "rounds of TestChaos_Quota; 0 skips it")

// chaosQuotaMB is the storage limit of a shared service in
// TestChaos_Quota: small, so a round fills one in seconds; a resize to
// 500/2 raises it to 2 GiB.
const chaosQuotaMB = 300

// chaosFillTable is the table a filler writes past the limit.
const chaosFillTable = "chaos_fill"

// TestChaos_Quota is TestChaos on a btrfs storage image where every service
// has its storage limit (300 MiB for the shared size): at a moment of each
// round chosen by the seed, one running service's tenant writes past its
// limit while the round's operations run and dbcloud (and maybe a
// postmaster) is killed and restarted. Besides TestChaos's invariants,
// after the round (storage-limit): that service is read-only with a
// status_reason naming the limit and the way out, its writes are refused
// with 25006 and reads work; every other running service takes a write;
// after the tenant's DELETE and VACUUM FULL it is writable again by
// itself, or, when a snapshot taken after the fill keeps it above the
// writable level (the limit counts snapshots), after a resize. The filled service is left out of the round's operations (the
// writer still writes to it), so that what is checked is the limit's.
func TestChaos_Quota(t *testing.T) {
	if *chaosQuotaRounds <= 0 {
		t.Skip("-chaos.quota.rounds is 0")
	}
	s := newServer(t, "--storage-image-gib", "8", "--storage-shared-mib", strconv.Itoa(chaosQuotaMB),
		"--storage-mib-per-memory-gib", "1024")
	runChaos(t, *chaosQuotaRounds, []*server{s}, chaosSetup{quotaMB: chaosQuotaMB})
}

// quotaFill is one round's tenant that writes past its limit.
type quotaFill struct {
	svc *chaos.Service
	// refused says the filler saw its write refused with 25006.
	refused bool
	done    chan struct{}
}

// startFill starts a tenant that writes past its limit: it picks a
// running shared service with pick (waiting a few seconds for one in a
// round that starts with none), keeps the round's operations off it, and
// writes. f.svc is nil after f.done when there was none to fill.
func (c *chaosRun) startFill(r int, pick uint64) *quotaFill {
	f := &quotaFill{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		var dsn string
		for wait := time.Now().Add(8 * time.Second); f.svc == nil; time.Sleep(200 * time.Millisecond) {
			c.mu.Lock()
			var cands []*chaos.Service
			for _, s := range c.m.Live() {
				if fillable(s) {
					cands = append(cands, s)
				}
			}
			if len(cands) > 0 {
				f.svc = cands[pick%uint64(len(cands))]
				c.reserved[f.svc.ID] = true
				dsn = chaos.DSN(f.svc.Endpoint, f.svc.Password(), c.boot.CAFile)
			}
			c.mu.Unlock()
			if f.svc == nil && time.Now().After(wait) {
				c.t.Logf("round %d: no running shared service to fill", r)
				return
			}
		}
		c.t.Logf("round %d: the tenant of %s writes past its %d MiB limit", r, f.svc.ID, c.quotaMB)
		f.refused = c.fill(r, f.svc, dsn, time.Now().Add(*chaosSettle))
	}()
	return f
}

// fillable says the service is one a tenant fills past its limit: running,
// shared (its limit is the test's), without replicas, its password known.
// Checked with c.mu held.
func fillable(s *chaos.Service) bool {
	return !s.Deleted && s.Running && s.Size == chaos.Shared && s.Replicas == 0 && len(s.Passwords) == 1 && s.Endpoint.Port != 0
}

// stillFillable is fillable under c.mu: an operation accepted just before
// the service was reserved (a stop, a delete, a resize) may change it.
func (c *chaosRun) stillFillable(s *chaos.Service) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fillable(s)
}

// fill writes into the service until a write is refused with 25006 (true)
// or until deadline (false). It writes as TestStorageLimit does, in chunks
// of an eighth of what is left below the read-only level, each followed by
// a wait for storage_mb to grow, so that the guard's measurement, not the
// filesystem's hard quota, is what stops it; and it carries on through
// kills of dbcloud (measurements pause) and of its postmaster (it logs in
// again).
func (c *chaosRun) fill(r int, svc *chaos.Service, dsn string, deadline time.Time) bool {
	ctx := context.Background()
	id := svc.ID
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(ctx)
		}
	}()
	used := int64(0)
	for time.Now().Before(deadline) && c.stillFillable(svc) {
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			var err error
			if conn, err = pgx.Connect(cctx, dsn); err == nil {
				_, err = conn.Exec(cctx, "CREATE TABLE IF NOT EXISTS "+chaosFillTable+" (pad text)")
			}
			cancel()
			if pgtest.SQLState(err) == "25006" {
				c.t.Logf("round %d: %s refuses the filler's CREATE TABLE: %v", r, id, err)
				return true
			}
			if err != nil {
				if conn != nil {
					conn.Close(ctx)
					conn = nil
				}
				time.Sleep(300 * time.Millisecond)
				continue
			}
		}
		if st, ok := c.storageOf(id); ok {
			used = storageMB(st)
		}
		// About 3,500 rows a MB of table; a MB of rows costs about four on
		// disk (table, WAL, its archived copy, WAL kept for reuse).
		chunkMB := max(1, (c.quotaMB*95/100-used)/8)
		qctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := conn.Exec(qctx, "INSERT INTO "+chaosFillTable+" SELECT repeat(md5(g::text), 8) FROM generate_series(1, $1) g", chunkMB*3500)
		cancel()
		if pgtest.SQLState(err) == "25006" {
			c.t.Logf("round %d: %s refuses the filler's writes at %d of %d MB: %v", r, id, used, c.quotaMB, err)
			return true
		}
		if err != nil {
			c.t.Logf("round %d: filler of %s: %v (SQLSTATE %s); logging in again", r, id, err, pgtest.SQLState(err))
			conn.Close(ctx)
			conn = nil
			time.Sleep(300 * time.Millisecond)
			continue
		}
		for wait := time.Now().Add(20 * time.Second); time.Now().Before(wait); time.Sleep(300 * time.Millisecond) {
			if st, ok := c.storageOf(id); ok && storageMB(st) > used {
				break
			}
		}
	}
	return false
}

// atOwnLimit says the write refused with err was refused by the
// service's own storage limit: 25006, and the API says so of it.
func (c *chaosRun) atOwnLimit(id string, err error) bool {
	st, ok := c.storageOf(id)
	return pgtest.SQLState(err) == "25006" && ok && strings.Contains(st.StatusReason, "writes that add data are refused")
}

// storageOf is what the API shows of a service's storage; false when the
// API does not answer (dbcloud is down).
func (c *chaosRun) storageOf(id string) (storageStatus, bool) {
	var st storageStatus
	code, err := c.get(c.services()+"/"+id, &st)
	return st, err == nil && code == 200
}

// checkFill checks, once the round's invariants hold, what a tenant past
// its limit must see, and gets it out again as a tenant would. It returns
// the violations (invariant storage-limit).
func (c *chaosRun) checkFill(r int, f *quotaFill) []string {
	c.mu.Lock()
	id, ep, pw := f.svc.ID, f.svc.Endpoint, f.svc.Password()
	var others []*chaos.Service
	for _, s := range c.m.Live() {
		if s.ID != id && s.Running && len(s.Passwords) == 1 && s.Endpoint.Port != 0 {
			others = append(others, s)
		}
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.reserved, id)
		c.mu.Unlock()
	}()
	if !c.stillFillable(f.svc) {
		c.t.Logf("round %d: %s was stopped, deleted or resized by an operation accepted before the filler began; not checked", r, id)
		return nil
	}
	var v []string
	fail := func(format string, args ...any) {
		v = append(v, fmt.Sprintf("[%s] service %s: %s", chaos.StorageLimit, id, fmt.Sprintf(format, args...)))
	}
	if !f.refused {
		fail("the tenant wrote past its %d MiB limit for %v and was never refused (25006)", c.quotaMB, *chaosSettle)
		return v
	}
	deadline := time.Now().Add(*chaosSettle)
	var st storageStatus
	for {
		var ok bool
		st, ok = c.storageOf(id)
		if ok && st.Status == "READY" && strings.Contains(st.StatusReason, "storage limit") && strings.Contains(st.StatusReason, "resize") {
			break
		}
		if time.Now().After(deadline) {
			fail("past its limit, the API shows %s %q, not READY with a reason naming the limit and the way out", st.Status, st.StatusReason)
			return v
		}
		time.Sleep(300 * time.Millisecond)
	}
	c.t.Logf("round %d: %s at its limit: %s %q (%d MB)", r, id, st.Status, st.StatusReason, storageMB(st))
	ctx := context.Background()
	dsn := chaos.DSN(ep, pw, c.boot.CAFile)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		fail("log in at the limit: %v", err)
		return v
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "INSERT INTO "+chaosFillTable+" VALUES ('one more')"); pgtest.SQLState(err) != "25006" {
		fail("a write at the limit answered %v, want SQLSTATE 25006", err)
	}
	var n int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+chaosFillTable).Scan(&n); err != nil {
		fail("a read at the limit: %v", err)
	}
	for _, o := range others {
		// On a loaded host a login and a commit can take seconds; a
		// failure lasting 30 s counts.
		err := c.writeRow(ctx, o)
		for until := time.Now().Add(30 * time.Second); err != nil && time.Now().Before(until); time.Sleep(time.Second) {
			err = c.writeRow(ctx, o)
		}
		if err != nil && c.atOwnLimit(o.ID, err) {
			// Its own limit, not the filled one's: where limits are
			// measured and snapshots are copies (TestChaos_Long), a
			// service that lives many rounds reaches 300 MiB by itself.
			c.t.Logf("round %d: %s refuses writes at its own storage limit; not a write the filled service could have blocked", r, o.ID)
			continue
		}
		if err != nil {
			v = append(v, fmt.Sprintf("[%s] service %s: while %s is at its limit, a write here failed: %v", chaos.StorageLimit, o.ID, id, err))
		}
	}
	// The way out that needs nobody: delete the data, give the space back.
	full, _ := c.storageOf(id)
	if _, err := conn.Exec(ctx, "DELETE FROM "+chaosFillTable); err != nil {
		fail("DELETE at the limit: %v", err)
		return v
	}
	if _, err := conn.Exec(ctx, "VACUUM FULL "+chaosFillTable); err != nil {
		fail("VACUUM FULL at the limit: %v", err)
		return v
	}
	// A measurement taken since (it differs from the last before the
	// DELETE) that is still at or above the writable level says the space
	// is held by what the tenant cannot delete: no use waiting out the
	// minute (on a host without quotas, a measured limit, that is the
	// usual case: a round would wait a minute for nothing).
	held := func(st storageStatus) bool {
		mb := storageMB(st)
		return mb != storageMB(full) && mb*100 >= c.quotaMB*dbcloud.StorageWritablePercent
	}
	if c.waitWritable(r, id, dsn, time.Now().Add(time.Minute), "DELETE and VACUUM FULL", held) {
		return v
	}
	// The limit counts snapshots and the WAL archive: what a snapshot
	// taken after the fill (a round's kills can delay a service's first
	// one) holds stays until it expires, and at this small limit that
	// alone can keep the service above the writable level. The other way
	// out the reason names: a size with a larger limit.
	st, _ = c.storageOf(id)
	c.t.Logf("round %d: %s still at its limit after DELETE and VACUUM FULL (%d MB: snapshots and archive hold the rest); resizing", r, id, storageMB(st))
	c.mu.Lock()
	op := c.opResize(f.svc)
	c.mu.Unlock()
	code, raw, _ := c.request(op.method, op.path, op.body, fmt.Sprintf("chaos-%d-%d-quota-resize", c.seed, r))
	c.mu.Lock()
	op.apply(code, raw, false)
	c.mu.Unlock()
	if !accepted(code) {
		fail("resize to a larger limit at the limit: %d %s", code, raw)
		return v
	}
	if !c.waitWritable(r, id, dsn, deadline.Add(*chaosSettle), "a resize to "+chaos.Small.String(), nil) {
		st, _ := c.storageOf(id)
		fail("still refusing writes after DELETE, VACUUM FULL and a resize: the API shows %s %q (%d MB)", st.Status, st.StatusReason, storageMB(st))
	}
	return v
}

// waitWritable polls until a write to the filled service succeeds and the
// API no longer says writes are refused, or until deadline, or until
// hopeless (when set) holds of what the API shows.
func (c *chaosRun) waitWritable(r int, id, dsn string, deadline time.Time, after string, hopeless func(storageStatus) bool) bool {
	ctx := context.Background()
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := pgx.Connect(cctx, dsn)
		if err == nil {
			_, err = conn.Exec(cctx, "INSERT INTO "+chaosFillTable+" VALUES ('writable again')")
			conn.Close(ctx)
		}
		cancel()
		st, ok := c.storageOf(id)
		if err == nil && ok && st.Status == "READY" && !strings.Contains(st.StatusReason, "refused") {
			c.t.Logf("round %d: %s writable again after %s (%d MB)", r, id, after, storageMB(st))
			return true
		}
		if time.Now().After(deadline) || ok && hopeless != nil && hopeless(st) {
			return false
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// writeRow commits one row to the service as the writer does, and records
// it as acknowledged.
func (c *chaosRun) writeRow(ctx context.Context, s *chaos.Service) error {
	c.mu.Lock()
	ep, pw := s.Endpoint, s.Password()
	c.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, chaos.DSN(ep, pw, c.boot.CAFile))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(cctx, "CREATE TABLE IF NOT EXISTS "+chaos.Table+" (id bigint PRIMARY KEY, payload text NOT NULL)"); err != nil {
		return err
	}
	row := c.nextRow.Add(1)
	payload := chaos.RowPayload(c.seed, row)
	if _, err := conn.Exec(cctx, "INSERT INTO "+chaos.Table+" (id, payload) VALUES ($1, $2)", row, payload); err != nil {
		return err
	}
	c.mu.Lock()
	s.Rows[row] = payload
	c.acked++
	c.mu.Unlock()
	return nil
}
