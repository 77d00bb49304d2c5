package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/postgres"
	"dbcloud/sizing"

	"github.com/jackc/pgx/v5"

	"dbcloud"
)

// Read replica sets (decisions.md section 7). Each node is a hot standby of
// the parent service's current primary, streaming over the primary's unix
// socket through a replication slot of its own, so the primary keeps the
// WAL a lagging node still needs. The set's endpoint is served by a proxy
// process (proxy.go) that spreads new connections over the nodes
// round-robin. A set lives in DATA/services/<set id>/ like a service: node
// n in n/, and proxy/, pooler/, tls/ and replicaset.json.

const replicaSetStateFile = "replicaset.json"

var _ dbcloud.ReplicaSetProvisioner = (*Runtime)(nil)

// replicaSetState is what the nodes were last configured for.
type replicaSetState struct {
	instancePorts
	// Upstream is the parent instance the nodes follow ("<id>@<port> <bin dir>");
	// ParentSize is the parent size their settings were raised to. When
	// either changes (a failover, a resize of the parent), the nodes are
	// reconfigured.
	Upstream   string       `json:"upstream"`
	ParentSize dbcloud.Size `json:"parent_size"`
}

// nodeAppName and nodeSlot name node n of set in the primary's views.
func nodeAppName(setID string, n int) string { return "rs_" + setID + "_" + strconv.Itoa(n) }
func nodeSlot(setID string, n int) string    { return "dbcloud_" + nodeAppName(setID, n) }

// upstreamKey names the primary a set's nodes follow, with its binaries:
// after a major version upgrade of the parent (upgrade.go) the key
// changes, so the check sends the set to its ensure, which copies the
// nodes again (ensureNode).
func upstreamKey(upstream postgres.Spec) string {
	return upstream.ID + "@" + strconv.Itoa(upstream.Port) + " " + upstream.BinDir
}

func (rt *Runtime) replicaSetStatePath(setID string) string {
	return filepath.Join(rt.serviceDir(setID), replicaSetStateFile)
}

func (rt *Runtime) loadReplicaSet(setID string) (*replicaSetState, error) {
	return readState[replicaSetState](rt.replicaSetStatePath(setID))
}

func (rt *Runtime) saveReplicaSet(setID string, st *replicaSetState) error {
	return writeState(rt.replicaSetStatePath(setID), st)
}

// nodeSpec is node n's spec: the set's size, certificate and internal
// port, following upstream. It is a pure function of its arguments, so
// every Reload renders the same config.
func (rt *Runtime) nodeSpec(set *dbcloud.Service, upstream postgres.Spec, st *replicaSetState, n int, certPEM, keyPEM []byte) postgres.Spec {
	res := sizing.For(set.Spec.Size)
	settings := maps.Clone(res.Settings)
	if settings == nil {
		settings = map[string]string{}
	}
	for _, k := range postgres.HotStandbyMinimums() {
		mine, _ := strconv.Atoi(settings[k])
		if theirs, err := strconv.Atoi(upstream.Settings[k]); err == nil && theirs > mine {
			settings[k] = upstream.Settings[k]
		}
	}
	for _, k := range sizing.PreloadSettings() {
		if v, ok := upstream.Settings[k]; ok {
			settings[k] = v
		}
	}
	settings["hot_standby"] = "on"
	// Queries on a node may hold back cleanup on the primary rather than be
	// cancelled by it: reads are what the set is for.
	settings["hot_standby_feedback"] = "on"
	// A walreceiver that lost its primary (a failover) retries every
	// second instead of every five.
	settings["wal_retrieve_retry_interval"] = "1s"
	settings["primary_conninfo"] = fmt.Sprintf("host=%s port=%d user="+postgres.ReplicatorRole+" application_name=%s",
		postgres.QuoteDSN(upstream.RunDir()), upstream.Port, nodeAppName(set.ID, n))
	settings["primary_slot_name"] = nodeSlot(set.ID, n)
	rt.storageSettings(set.ID, rt.cfg.StorageLimits.Of(st.ParentSize), settings)
	return postgres.Spec{
		ID: set.ID + "-" + strconv.Itoa(n), Dir: filepath.Join(rt.serviceDir(set.ID), strconv.Itoa(n)),
		ListenAddr: rt.listenAddr(), Port: st.Ports[n], Settings: settings, CertPEM: certPEM, KeyPEM: keyPEM,
		CPUMillis: res.CPUMillis, CPUShares: res.CPUShares, MemoryBytes: res.MemoryBytes,
		// The set reads its parent's data and reaches its parent's
		// socket: it runs as the parent's OS user, and its version.
		Owner: upstream.Owner, BinDir: upstream.BinDir,
	}
}

// replicaSetBase is what every step needs: the set seen as a service (its
// endpoint, size and pooler) and the parent's current primary. It writes
// nothing; replicaSetCert makes the set's directory and certificate.
func (rt *Runtime) replicaSetBase(parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) (svc *dbcloud.Service, upstream postgres.Spec, err error) {
	svc = set.AsService(parent)
	if svc.Endpoint == nil {
		return nil, postgres.Spec{}, dbcloud.Terminal(fmt.Errorf("read replica set %s has no endpoint", set.ID))
	}
	if upstream, err = rt.primary(parent); err != nil {
		return nil, postgres.Spec{}, err
	}
	return svc, upstream, nil
}

// replicaSetCert makes the set's directory and returns its certificate,
// issued once.
// It is the parent's identity's, as the set's processes are.
func (rt *Runtime) replicaSetCert(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet, svc *dbcloud.Service, upstream postgres.Spec) (cert, key []byte, err error) {
	if err := rt.makeReplicaSetVolume(ctx, parent, set); err != nil {
		return nil, nil, err
	}
	if err := rt.makeServiceDir(svc.ID, upstream.Owner); err != nil {
		return nil, nil, err
	}
	return rt.serverCert(svc)
}

// makeReplicaSetVolume makes the set's directory a volume (where the
// filesystem has quotas), so that its nodes cannot fill the disk that
// other tenants share. Each node is a physical copy of the parent, so
// its limit is the parent's (not the set's size's: a small set of a large
// parent must hold the parent's data) once per node: what the parent may
// keep beside its WAL archive and snapshots, which nodes do not have,
// leaves room for WAL a lagging node keeps. A change of the node count or
// of the parent's size moves the limit at the next ensure. A set made
// before sets had volumes keeps its plain directory, unlimited.
func (rt *Runtime) makeReplicaSetVolume(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) error {
	dir := rt.serviceDir(set.ID)
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return err
	}
	nodes := int64(max(1, set.Spec.Nodes))
	return rt.volumes.Create(ctx, dir, 0o700, nodes*hardLimit(rt.cfg.StorageLimits.Of(parent.Spec.Size)))
}

// EnsureReplicaSet makes the set's nodes, endpoint and pooler match its
// spec, following the parent's current primary.
func (rt *Runtime) EnsureReplicaSet(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) (*dbcloud.Observation, error) {
	obs, err := rt.ensureReplicaSet(ctx, parent, set)
	return obs, userError(err)
}

func (rt *Runtime) ensureReplicaSet(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) (*dbcloud.Observation, error) {
	svc, upstream, err := rt.replicaSetBase(parent, set)
	if err != nil {
		return nil, err
	}
	cert, key, err := rt.replicaSetCert(ctx, parent, set, svc, upstream)
	if err != nil {
		return nil, err
	}
	_, upstreamUp := rt.instances.Running(upstream)
	st, err := rt.loadReplicaSet(set.ID)
	if err != nil {
		return nil, err
	}
	if st == nil {
		st = &replicaSetState{instancePorts: newInstancePorts()}
	}
	used := slices.Collect(maps.Values(st.Ports))
	for n := range set.Spec.Nodes {
		if st.Ports[n] == 0 {
			if st.Ports[n], err = rt.freePort(used); err != nil {
				return nil, err
			}
			used = append(used, st.Ports[n])
		}
	}
	if err := rt.saveReplicaSet(set.ID, st); err != nil {
		return nil, err
	}

	// Nodes beyond the count go first: out of the proxy, then stopped and
	// removed with their slots.
	var keep, remove []int
	for n := range st.Ports {
		if n < set.Spec.Nodes {
			keep = append(keep, n)
		} else {
			remove = append(remove, n)
		}
	}
	slices.Sort(keep)
	if len(remove) > 0 {
		if rt.proxyRunning(set.ID) {
			if err := rt.setProxy(ctx, set.ID, upstream.Owner, rt.proxyListen(svc), rt.nodeTargets(st, keep)...); err != nil {
				return nil, err
			}
		}
		for _, n := range remove {
			spec := rt.nodeSpec(svc, upstream, st, n, cert, key)
			if err := rt.instances.Destroy(ctx, spec); err != nil {
				return nil, fmt.Errorf("remove node %s: %w", spec.ID, err)
			}
			if upstreamUp {
				if err := rt.instances.DropSlots(ctx, upstream, nodeSlot(set.ID, n)); err != nil {
					return nil, err
				}
			}
			delete(st.Ports, n)
			if err := rt.saveReplicaSet(set.ID, st); err != nil {
				return nil, err
			}
		}
	}

	// Every node a running standby of the current primary.
	for _, n := range keep {
		spec := rt.nodeSpec(svc, upstream, st, n, cert, key)
		if err := rt.ensureNode(ctx, upstream, upstreamUp, spec, nodeAppName(set.ID, n), false); err != nil {
			return nil, err
		}
	}
	st.Upstream, st.ParentSize = upstreamKey(upstream), parent.Spec.Size
	if err := rt.saveReplicaSet(set.ID, st); err != nil {
		return nil, err
	}
	if upstreamUp {
		// A node that does not reach the primary in time has diverged from
		// it (it received WAL a failed-over primary never had) or lost the
		// WAL it needs: it is copied afresh.
		for _, n := range rt.notStreaming(ctx, upstream, set.ID, keep, postgres.StreamingWait) {
			spec := rt.nodeSpec(svc, upstream, st, n, cert, key)
			rt.cfg.Logger.Warn("read replica does not follow its primary; copying it again", "instance", spec.ID, "primary", upstream.ID)
			if err := rt.ensureNode(ctx, upstream, upstreamUp, spec, nodeAppName(set.ID, n), true); err != nil {
				return nil, err
			}
		}
		if late := rt.notStreaming(ctx, upstream, set.ID, keep, postgres.StreamingWait); len(late) > 0 {
			return nil, fmt.Errorf("read replica set %s: nodes %v do not stream from %s", set.ID, late, upstream.ID)
		}
	}

	if err := rt.setProxy(ctx, set.ID, upstream.Owner, rt.proxyListen(svc), rt.nodeTargets(st, keep)...); err != nil {
		return nil, err
	}
	if err := rt.checkEndpoint(ctx, svc.Endpoint); err != nil {
		return nil, err
	}
	obs := &dbcloud.Observation{Instances: svc.Instances}
	if len(keep) == 0 {
		return nil, dbcloud.Terminal(fmt.Errorf("read replica set %s has no nodes", set.ID))
	}
	first := rt.nodeSpec(svc, upstream, st, keep[0], cert, key)
	if svc.Spec.Pooler && !upstreamUp {
		return nil, fmt.Errorf("the pooler of read replica set %s waits for the primary of %s", set.ID, parent.ID)
	}
	if obs.PoolerEndpoint, err = rt.ensurePooler(ctx, svc, first, upstream, svc.PoolerPort); err != nil {
		return nil, err
	}
	obs.Running = true
	return obs, nil
}

// ensureNode makes spec a running standby of upstream: its slot exists,
// and its data is a copy of upstream's (made now if missing or if fresh
// is set). Without a running upstream a node with data still starts and
// serves what it has.
func (rt *Runtime) ensureNode(ctx context.Context, upstream postgres.Spec, upstreamUp bool, spec postgres.Spec, app string, fresh bool) error {
	_, statErr := tenantfs.Lstat(filepath.Join(spec.PGData(), "PG_VERSION"))
	if statErr == nil && upstreamUp && !fresh {
		// A node of the version before its parent's upgrade is no copy
		// of the parent any more.
		mine, err := dataVersion(spec.PGData())
		theirs, uerr := dataVersion(upstream.PGData())
		fresh = err == nil && uerr == nil && mine != theirs
	}
	if (statErr != nil || fresh) && !upstreamUp {
		return fmt.Errorf("node %s waits for its primary %s to run", spec.ID, upstream.ID)
	}
	if upstreamUp {
		if err := rt.instances.CreateSlot(ctx, upstream, spec.Settings["primary_slot_name"]); err != nil {
			return err
		}
	}
	if statErr != nil || fresh {
		if err := rt.stopInstance(ctx, spec, 10*time.Second); err != nil {
			return err
		}
		if err := rt.instances.Clone(ctx, upstream, spec, app); err != nil {
			return err
		}
	}
	if err := rt.instances.WriteStandbySignal(spec); err != nil {
		return err
	}
	if upstreamUp {
		if err := rt.instances.RestartpointPastParameters(ctx, upstream, spec); err != nil {
			return err
		}
	}
	return rt.instances.Ensure(ctx, spec)
}

// notStreaming returns the nodes that are not connected to upstream
// (catching up counts as connected) after waiting up to wait for them.
func (rt *Runtime) notStreaming(ctx context.Context, upstream postgres.Spec, setID string, nodes []int, wait time.Duration) []int {
	deadline := time.Now().Add(wait)
	for {
		var late []int
		senders, err := rt.instances.WALSenders(ctx, upstream)
		for _, n := range nodes {
			if s := senders[nodeAppName(setID, n)]; err != nil || (s != "streaming" && s != "catchup") {
				late = append(late, n)
			}
		}
		if len(late) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return late
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (rt *Runtime) nodeTargets(st *replicaSetState, nodes []int) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, net.JoinHostPort(rt.cfg.Host, strconv.Itoa(st.Ports[n])))
	}
	return out
}

// dropStaleSlots drops the slots of read replica nodes whose set is gone:
// a set deleted while its parent was stopped could not drop them, and a
// slot nobody reads from keeps WAL on the primary for ever.
func (rt *Runtime) dropStaleSlots(ctx context.Context, conn *pgx.Conn, primary postgres.Spec) error {
	// A persistent slot has its directory in pg_replslot from its
	// creation on: with none there (every new service) there is nothing
	// to drop, and no query to wait for on an instance under its CPU quota.
	if held, err := tenantfs.ReadDir(filepath.Join(primary.PGData(), "pg_replslot")); err == nil && len(held) == 0 {
		return nil
	}
	rows, err := conn.Query(ctx, `SELECT slot_name::text FROM pg_replication_slots WHERE slot_name LIKE 'dbcloud\_rs\_%' AND NOT active`)
	if err != nil {
		return err
	}
	var stale []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return err
		}
		setID, _, ok := strings.Cut(strings.TrimPrefix(name, "dbcloud_rs_"), "_")
		if !ok {
			continue
		}
		if _, err := os.Stat(rt.replicaSetStatePath(setID)); errors.Is(err, fs.ErrNotExist) {
			stale = append(stale, name)
		}
	}
	if err := rows.Err(); err != nil || len(stale) == 0 {
		return err
	}
	rt.cfg.Logger.Info("dropping slots of deleted read replicas", "instance", primary.ID, "slots", strings.Join(stale, ","))
	return rt.instances.DropSlots(ctx, primary, stale...)
}

// CheckReplicaSet reports whether every node, the endpoint proxy and the
// pooler run, and whether the nodes follow the parent's primary of now.
func (rt *Runtime) CheckReplicaSet(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) (*dbcloud.Observation, error) {
	svc, upstream, err := rt.replicaSetBase(parent, set)
	if err != nil {
		return nil, err
	}
	obs := &dbcloud.Observation{Instances: svc.Instances}
	st, err := rt.loadReplicaSet(set.ID)
	if err != nil {
		return nil, err
	}
	switch {
	case st == nil || len(st.Ports) != set.Spec.Nodes:
		obs.Reason = "Nodes are being added or removed."
	case st.Upstream != upstreamKey(upstream):
		obs.Reason = fmt.Sprintf("The primary of service %s moved; the nodes are following it.", parent.ID)
	case st.ParentSize != parent.Spec.Size:
		obs.Reason = fmt.Sprintf("Service %s was resized; the nodes are taking its limits.", parent.ID)
	case !rt.proxyRunning(set.ID):
		obs.Reason = "The endpoint proxy is not running; restarting it."
	case svc.Spec.Pooler && !rt.poolerRunning(set.ID):
		obs.Reason = "The connection pooler is not running; restarting it."
	}
	if obs.Reason != "" {
		return obs, nil
	}
	for n := range set.Spec.Nodes {
		if _, ok := rt.instances.Running(rt.nodeSpec(svc, upstream, st, n, nil, nil)); !ok {
			obs.Reason = fmt.Sprintf("Node %s-%d is not running; restarting it.", set.ID, n)
			return obs, nil
		}
	}
	obs.Running = true
	return obs, nil
}

// DeleteReplicaSet stops the set's pooler, proxy and nodes, drops their
// slots on the parent's primary when it runs (else the parent's next
// ensure does) and removes the set's files. parent may be nil.
func (rt *Runtime) DeleteReplicaSet(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) error {
	if err := rt.stopPooler(ctx, set.ID); err != nil {
		return err
	}
	if err := rt.stopProxy(ctx, set.ID); err != nil {
		return err
	}
	dir := rt.serviceDir(set.ID)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var slots []string
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		spec := postgres.Spec{ID: set.ID + "-" + e.Name(), Dir: filepath.Join(dir, e.Name())}
		if err := rt.instances.Destroy(ctx, spec); err != nil {
			return fmt.Errorf("destroy %s: %w", spec.ID, err)
		}
		slots = append(slots, nodeSlot(set.ID, n))
	}
	if parent != nil && parent.Endpoint != nil && len(slots) > 0 {
		if upstream, err := rt.primary(parent); err == nil {
			if _, up := rt.instances.Running(upstream); up {
				if err := rt.instances.DropSlots(ctx, upstream, slots...); err != nil {
					return err
				}
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	rt.cfg.Logger.Info("read replica set deleted", "replica_set", set.ID)
	return nil
}
