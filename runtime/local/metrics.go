package local

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"dbcloud"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"

	"github.com/jackc/pgx/v5"
)

// databaseQuery measures a primary in one round trip: client sessions
// (dbcloud's own left out), the pooler's server connections (it reaches
// the instance over the unix socket, where client_port is -1; tenants
// reach it over TCP through the endpoint proxy), transactions so far, the
// WAL position, and the rows changed and temporary bytes written so far
// (which move, as the WAL does not, with writes to unlogged tables and
// temporary files: measureStorage's other sign of growth).
const databaseQuery = `SELECT
	(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'
		AND NOT (usename = 'postgres' AND application_name = 'dbcloud')),
	(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'
		AND client_port = -1 AND usename <> 'postgres'),
	(SELECT COALESCE(sum(xact_commit + xact_rollback), 0)::bigint FROM pg_stat_database),
	pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
	(SELECT COALESCE(sum(tup_inserted + tup_updated + tup_deleted + temp_bytes), 0)::bigint FROM pg_stat_database)`

// lagQuery is the replay lag of every node streaming from the primary,
// named by the application_name each node's primary_conninfo sets.
const lagQuery = `SELECT application_name,
	COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), 0)::bigint
	FROM pg_stat_replication`

// measureTimeout bounds one sample: a busy or locked database gives no
// sample rather than a slow health loop.
const measureTimeout = 2 * time.Second

// databaseMetrics measures inside the primary and at its pooler; nil when
// the primary cannot be asked (the host usage is still reported).
func (rt *Runtime) databaseMetrics(ctx context.Context, svc *dbcloud.Service, spec postgres.Spec, at time.Time) *dbcloud.DatabaseMetrics {
	ctx, cancel := context.WithTimeout(ctx, measureTimeout)
	defer cancel()
	var d *dbcloud.DatabaseMetrics
	var servers, xacts, changes int64
	err := rt.sessions.with(ctx, svc.ID, spec, rt.instances.Connect, func(conn *pgx.Conn) (err error) {
		d, servers, xacts, changes, err = queryDatabase(ctx, conn)
		return err
	})
	if err != nil {
		return nil
	}
	if svc.Spec.Pooler && svc.PoolerPort > 0 && rt.poolerRunning(svc.ID) {
		clients := int64(proc.EstablishedOnPort(svc.PoolerPort))
		d.PoolerClients, d.PoolerServers = &clients, &servers
	}
	rt.mu.Lock()
	last, ok := rt.xacts[svc.ID]
	rt.xacts[svc.ID] = xactSample{n: xacts, at: at, changes: changes}
	rt.mu.Unlock()
	if ok && at.After(last.at) && xacts >= last.n {
		d.TransactionsPerSec = float64(xacts-last.n) / at.Sub(last.at).Seconds()
	}
	return d
}

// queryDatabase runs databaseQuery and lagQuery on conn.
func queryDatabase(ctx context.Context, conn *pgx.Conn) (d *dbcloud.DatabaseMetrics, servers, xacts, changes int64, err error) {
	d = &dbcloud.DatabaseMetrics{}
	// The simple protocol: one round trip a query, where the extended
	// one first prepares (and describes) each statement.
	if err := conn.QueryRow(ctx, databaseQuery, pgx.QueryExecModeSimpleProtocol).Scan(&d.Connections, &servers, &xacts, &d.WALBytes, &changes); err != nil {
		return nil, 0, 0, 0, err
	}
	rows, err := conn.Query(ctx, lagQuery, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var app string
		var lag int64
		if rows.Scan(&app, &lag) != nil {
			continue
		}
		if r, ok := parseAppName(app); ok {
			r.LagBytes = lag
			d.Replication = append(d.Replication, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, 0, 0, err
	}
	return d, servers, xacts, changes, nil
}

// PoolReady is how many prepared clusters wait for creates now, and
// PoolTarget how many the pool is refilled to.
func (rt *Runtime) PoolReady() int  { return rt.instances.PoolReady() }
func (rt *Runtime) PoolTarget() int { return rt.instances.PoolTarget() }

// xactSample is the last transaction count of a service, for rates, and
// its count of changed rows and temporary bytes.
type xactSample struct {
	n       int64
	at      time.Time
	changes int64
}

// parseAppName reads appName and nodeAppName back: "instance_N" is HA
// instance N, "rs_SET_N" node N of read replica set SET.
func parseAppName(app string) (dbcloud.ReplicationLag, bool) {
	if n, ok := strings.CutPrefix(app, "instance_"); ok {
		i, err := strconv.Atoi(n)
		return dbcloud.ReplicationLag{Ordinal: i}, err == nil
	}
	if rest, ok := strings.CutPrefix(app, "rs_"); ok {
		j := strings.LastIndexByte(rest, '_')
		if j <= 0 {
			return dbcloud.ReplicationLag{}, false
		}
		i, err := strconv.Atoi(rest[j+1:])
		return dbcloud.ReplicationLag{ReplicaSetID: rest[:j], Ordinal: i}, err == nil
	}
	return dbcloud.ReplicationLag{}, false
}

// storageMaxAge is the longest a service's storage goes unmeasured while
// nothing shows it can have grown.
const storageMaxAge = 10 * time.Minute

// storageSettle is how long after a write the filesystem's accounting may
// still not show it: btrfs counts a quota group's blocks when its
// transaction commits (every 30 s by default), and the kernel writes dirty
// pages back 30 s after they were dirtied, its flusher waking every 5 s.
const storageSettle = 35 * time.Second

// storageSample is a service's last storage measurement, the database's
// counters it was taken at, and when those counters were last seen to
// move.
type storageSample struct {
	used    int64
	wal     int64
	changes int64
	at      time.Time
	moved   time.Time
}

// next is the sample a measurement of used makes, taken now at the
// database's counters wal and changes, after s.
func (s storageSample) next(used, wal, changes int64, now time.Time) storageSample {
	moved := now
	if s.counts(wal, changes) {
		moved = s.moved
	}
	return storageSample{used: used, wal: wal, changes: changes, at: now, moved: moved}
}

func (s storageSample) counts(wal, changes int64) bool {
	return !s.at.IsZero() && s.wal == wal && s.changes == changes
}

// reusable reports whether the sample still is the service's size at the
// counters wal and changes: nothing moved them since it was taken, it was
// taken late enough after they last moved for the filesystem to have
// accounted what moved them (until then a measurement can show the size
// before the write, and reusing it would hide the write until
// storageMaxAge), and it is younger than storageMaxAge.
func (s storageSample) reusable(wal, changes int64, now time.Time) bool {
	return s.counts(wal, changes) && s.at.Sub(s.moved) >= storageSettle && now.Sub(s.at) < storageMaxAge
}

// measureStorage is what the service keeps on disk (serviceStorage). That
// takes a stat of every file of the data directory, the archive and the
// snapshots, which at hundreds of services was most of the health loop's
// CPU; so it is measured again only when it can have grown: when the
// primary's WAL moved since the last measurement (every logged change, and
// so every archived segment and snapshot, moves it) or its count of changed
// rows and temporary bytes did (writes to unlogged tables and temporary
// files, which the WAL does not see, once their transaction ends), when
// the service was near its limit, when the database could not be asked,
// or storageMaxAge after the last measurement (what neither counter sees:
// an unlogged table's transaction still running). A measurement taken
// within storageSettle of the counters' last move is not reused: the
// filesystem may not have accounted the write yet.
func (rt *Runtime) measureStorage(ctx context.Context, id string, primary postgres.Spec, db *dbcloud.DatabaseMetrics) (int64, error) {
	now := time.Now()
	rt.mu.Lock()
	last := rt.storage[id]
	near := rt.storageNear[id]
	changes := rt.xacts[id].changes
	rt.mu.Unlock()
	if !near && db != nil && last.reusable(db.WALBytes, changes, now) {
		return last.used, nil
	}
	used, err := rt.serviceStorage(ctx, id, func() (int64, error) { return rt.instances.DataSize(primary) })
	if err != nil {
		return 0, err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if db != nil {
		rt.storage[id] = last.next(used, db.WALBytes, changes, now)
	} else {
		delete(rt.storage, id)
	}
	return used, nil
}

// metricsSessions keeps one superuser session per measured service open
// between samples. A new session a sample forked a backend, set it up and
// authenticated it under the service's CPU quota every MetricsInterval:
// at hundreds of idle services, a large part of the host's idle CPU. A
// kept session costs an idle backend (a megabyte or two of the service's
// memory) and nothing while it waits.
//
// A kept session would hold up a smart shutdown (which waits for every
// session to end) until the stop ladder's next signal, so whatever is
// about to change a service's instances closes its session first (close:
// EnsureService and DeleteService do); it is opened again at the next
// sample. A session that fails (the postmaster restarted, the tenant
// ended the backend) is closed and the sample tried once on a new one.
type metricsSessions struct {
	mu sync.Mutex
	m  map[string]*metricsSession // by service ID
}

// metricsSession is one service's kept session, to the instance it was
// opened on (a failover moves the primary). Its mutex makes a sample and
// a close wait for each other: a pgx.Conn serves one caller at a time.
type metricsSession struct {
	mu       sync.Mutex
	instance string
	conn     *pgx.Conn
}

// connectFunc opens a superuser session on an instance (Instances.Connect).
type connectFunc func(ctx context.Context, s postgres.Spec, db string) (*pgx.Conn, error)

// session returns the service's entry, made empty if it has none.
func (ms *metricsSessions) session(id string) *metricsSession {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[string]*metricsSession{}
	}
	s := ms.m[id]
	if s == nil {
		s = &metricsSession{}
		ms.m[id] = s
	}
	return s
}

// with runs fn on the service's kept session to spec's instance, opening
// one if there is none (or it is to another instance); a kept session fn
// fails on is replaced by a new one and fn tried once more.
func (ms *metricsSessions) with(ctx context.Context, id string, spec postgres.Spec, connect connectFunc, fn func(*pgx.Conn) error) error {
	s := ms.session(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil && (s.instance != spec.ID || s.conn.IsClosed()) {
		s.closeLocked(ctx)
	}
	if s.conn != nil {
		if err := fn(s.conn); err == nil {
			return nil
		}
		s.closeLocked(ctx)
	}
	conn, err := connect(ctx, spec, "postgres")
	if err != nil {
		return err
	}
	if err := fn(conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return err
	}
	s.instance, s.conn = spec.ID, conn
	return nil
}

// close ends the service's kept session, if any, and forgets it.
func (ms *metricsSessions) close(ctx context.Context, id string) {
	ms.mu.Lock()
	s := ms.m[id]
	delete(ms.m, id)
	ms.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		s.closeLocked(ctx)
		s.mu.Unlock()
	}
}

// closeInstance ends every kept session to the instance: before any stop
// of it, since a smart shutdown waits for sessions.
func (ms *metricsSessions) closeInstance(ctx context.Context, instanceID string) {
	ms.mu.Lock()
	kept := slices.Collect(maps.Values(ms.m))
	ms.mu.Unlock()
	for _, s := range kept {
		s.mu.Lock()
		if s.conn != nil && s.instance == instanceID {
			s.closeLocked(ctx)
		}
		s.mu.Unlock()
	}
}

// closeAll ends every kept session (the runtime closes).
func (ms *metricsSessions) closeAll(ctx context.Context) {
	ms.mu.Lock()
	ids := slices.Collect(maps.Keys(ms.m))
	ms.mu.Unlock()
	for _, id := range ids {
		ms.close(ctx, id)
	}
}

func (s *metricsSession) closeLocked(ctx context.Context) {
	if s.conn != nil {
		// Bounded: a close sends Terminate on a local socket.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		s.conn.Close(cctx)
		cancel()
	}
	s.instance, s.conn = "", nil
}
