package local

import (
	"context"
	"strconv"
	"strings"
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
	conn, err := rt.instances.Connect(ctx, spec, "postgres")
	if err != nil {
		return nil
	}
	defer conn.Close(context.WithoutCancel(ctx))
	d := &dbcloud.DatabaseMetrics{}
	var servers, xacts, changes int64
	// The simple protocol: one round trip a query, where the extended
	// one first prepares (and describes) each on this new connection; at
	// hundreds of services the preparing was a third of this function's CPU.
	if err := conn.QueryRow(ctx, databaseQuery, pgx.QueryExecModeSimpleProtocol).Scan(&d.Connections, &servers, &xacts, &d.WALBytes, &changes); err != nil {
		return nil
	}
	rows, err := conn.Query(ctx, lagQuery, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil
	}
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
	rows.Close()
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

// storageSample is a service's last storage measurement and the database's
// counters it was taken at.
type storageSample struct {
	used    int64
	wal     int64
	changes int64
	at      time.Time
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
// an unlogged table's transaction still running).
func (rt *Runtime) measureStorage(ctx context.Context, id string, primary postgres.Spec, db *dbcloud.DatabaseMetrics) (int64, error) {
	now := time.Now()
	rt.mu.Lock()
	last, ok := rt.storage[id]
	near := rt.storageNear[id]
	changes := rt.xacts[id].changes
	rt.mu.Unlock()
	if ok && !near && db != nil && db.WALBytes == last.wal && changes == last.changes && now.Sub(last.at) < storageMaxAge {
		return last.used, nil
	}
	used, err := rt.serviceStorage(ctx, id, func() (int64, error) { return rt.instances.DataSize(primary) })
	if err != nil {
		return 0, err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if db != nil {
		rt.storage[id] = storageSample{used: used, wal: db.WALBytes, changes: changes, at: now}
	} else {
		delete(rt.storage, id)
	}
	return used, nil
}
