package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud"
	"dbcloud/tlsca"
)

// HA on one host (runtime-notes §3, §4). A service with HA replicas has
// instances 0..n in DATA/services/<id>/<n>; which one is the primary is
// recorded in ha.json, so instance numbers never change. Every instance
// listens on an internal port; the service's endpoint port belongs to a
// separate proxy process (proxy.go) that forwards to the current primary.
// The runtime is the single decider: on failover it points the proxy at
// nothing, fences the old primary (kills its whole cgroup and waits until
// it is empty), promotes the most advanced standby, points the proxy at
// it, rewires the other standbys and rebuilds the old primary as a standby.

const (
	haStateFile = "ha.json"
	// failoverGrace is how long a dead primary may take to come back
	// before a standby is promoted (the health loop adds up to one check
	// interval to it).
	failoverGrace = time.Second
	// streamingWait bounds how long an ensure waits for standbys to stream
	// before it leaves the slow ones out of synchronous_standby_names.
	streamingWait = 10 * time.Second
)

// haState is the service's HA layout, written atomically.
type haState struct {
	// Primary is the instance number of the current primary.
	Primary int `json:"primary"`
	// Members are the instance numbers, primary included, ascending.
	Members []int `json:"members"`
	// Ports are the internal ports, by instance number.
	Ports map[int]int `json:"ports"`
	// Sync are the standbys named in synchronous_standby_names and
	// SyncCount the n of 'ANY n (...)': only standbys seen streaming.
	Sync      []int `json:"sync,omitempty"`
	SyncCount int   `json:"sync_count,omitempty"`
	// Rebuild are members whose data may have diverged from the primary's
	// (a former primary): they are rewound or copied before they start.
	Rebuild []int `json:"rebuild,omitempty"`
}

// downSince remembers, per service, since when its primary is seen dead.
var downSince sync.Map // service id -> time.Time

func (rt *Runtime) haPath(serviceID string) string {
	return filepath.Join(rt.serviceDir(serviceID), haStateFile)
}

// loadHA returns the service's HA state, nil if it never had replicas.
func (rt *Runtime) loadHA(serviceID string) (*haState, error) {
	st, err := readState[haState](rt.haPath(serviceID))
	if st != nil && st.Ports == nil {
		st.Ports = map[int]int{}
	}
	return st, err
}

func (rt *Runtime) saveHA(serviceID string, st *haState) error {
	slices.Sort(st.Members)
	return writeState(rt.haPath(serviceID), st)
}

// readState reads a JSON state file of the runtime; nil if there is none.
func readState[T any](path string) (*T, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var st T
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &st, nil
}

// writeState replaces a JSON state file atomically.
func writeState(path string, st any) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return tlsca.WriteFileAtomic(path, data, 0o600)
}

// isHA reports whether the service runs the HA way: it has replicas now or
// had them (its instances stay on internal ports behind the proxy).
func (rt *Runtime) isHA(svc *dbcloud.Service) bool {
	if svc.Spec.Replicas > 0 {
		return true
	}
	_, err := os.Stat(rt.haPath(svc.ID))
	return err == nil
}

// currentPrimary turns primary()'s spec (instance 0 on the endpoint port)
// into the spec of the current primary when the service is HA.
func (rt *Runtime) currentPrimary(svc *dbcloud.Service, base InstanceSpec) (InstanceSpec, error) {
	st, err := rt.loadHA(svc.ID)
	if err != nil || st == nil {
		return base, err
	}
	return rt.haSpec(svc, base, st, st.Primary), nil
}

func appName(n int) string  { return "instance_" + strconv.Itoa(n) }
func slotName(n int) string { return "dbcloud_instance_" + strconv.Itoa(n) }

// haSpec is instance n's spec: base's certificate, limits and archive, its
// own directory and internal port, and the replication settings of its
// role. It is a pure function of the state, so every Reload renders the
// same config.
func (rt *Runtime) haSpec(svc *dbcloud.Service, base InstanceSpec, st *haState, n int) InstanceSpec {
	s := base
	s.ID = svc.ID + "-" + strconv.Itoa(n)
	s.Dir = filepath.Join(rt.serviceDir(svc.ID), strconv.Itoa(n))
	s.Port = st.Ports[n]
	s.ListenAddr = rt.listenAddr() // the proxy serves the VPC address
	s.Settings = addonSettings(ResourcesFor(svc.Spec.Size), svc.Spec.Addons)
	s.Settings["wal_log_hints"] = "on" // pg_rewind of a former primary
	s.Settings["hot_standby"] = "on"
	if n == st.Primary {
		if st.SyncCount > 0 && len(st.Sync) > 0 {
			names := make([]string, len(st.Sync))
			for i, m := range st.Sync {
				names[i] = `"` + appName(m) + `"`
			}
			s.Settings["synchronous_standby_names"] = fmt.Sprintf("ANY %d (%s)", st.SyncCount, strings.Join(names, ", "))
		}
		return s
	}
	primaryDir := filepath.Join(rt.serviceDir(svc.ID), strconv.Itoa(st.Primary))
	s.Settings["primary_conninfo"] = fmt.Sprintf("host=%s port=%d user=postgres application_name=%s",
		quoteDSN(filepath.Join(primaryDir, "run")), st.Ports[st.Primary], appName(n))
	s.Settings["primary_slot_name"] = slotName(n)
	return s
}

// proxyListen lists the addresses the service's endpoint proxy listens on.
func (rt *Runtime) proxyListen(svc *dbcloud.Service) []string {
	host := rt.cfg.Host
	if rt.listenAddr() == "*" {
		host = ""
	}
	out := []string{net.JoinHostPort(host, strconv.Itoa(svc.Endpoint.Port))}
	if ep := svc.VPCEndpoint; ep != nil && host != "" {
		out = append(out, net.JoinHostPort(ep.Host, strconv.Itoa(svc.Endpoint.Port)))
	}
	return out
}

// freeInternalPort picks a port the kernel has free on the instance host.
func (rt *Runtime) freeInternalPort(st *haState) (int, error) {
	return rt.freePort(slices.Collect(maps.Values(st.Ports)))
}

func haInstances(svc *dbcloud.Service, st *haState) []dbcloud.Instance {
	var out []dbcloud.Instance
	for _, n := range st.Members {
		role := "replica"
		if n == st.Primary {
			role = "primary"
		}
		out = append(out, dbcloud.Instance{ID: svc.ID + "-" + strconv.Itoa(n), Role: role})
	}
	return out
}

// ensureHA is EnsureService for an HA service.
func (rt *Runtime) ensureHA(ctx context.Context, svc *dbcloud.Service) (*dbcloud.Observation, error) {
	base, err := rt.primary(svc)
	if err != nil {
		return nil, err
	}
	st, err := rt.loadHA(svc.ID)
	if err != nil {
		return nil, err
	}
	if st == nil {
		st = &haState{Primary: 0, Members: []int{0}, Ports: map[int]int{}}
	}
	// Members: the primary plus Replicas standbys; new ones take the
	// lowest free numbers, removed ones are the highest standbys.
	want := svc.Spec.Replicas + 1
	for n := 0; len(st.Members) < want; n++ {
		if !slices.Contains(st.Members, n) {
			st.Members = append(st.Members, n)
			slices.Sort(st.Members)
		}
	}
	var remove []int
	for i := len(st.Members) - 1; i >= 0 && len(st.Members)-len(remove) > want; i-- {
		if n := st.Members[i]; n != st.Primary {
			remove = append(remove, n)
		}
	}
	for _, n := range st.Members {
		if st.Ports[n] == 0 {
			if st.Ports[n], err = rt.freeInternalPort(st); err != nil {
				return nil, err
			}
		}
	}
	if err := rt.saveHA(svc.ID, st); err != nil {
		return nil, err
	}
	obs := &dbcloud.Observation{}
	if !svc.Spec.Running {
		if err := rt.stopPooler(ctx, svc.ID); err != nil {
			return nil, err
		}
		if err := rt.stopProxy(ctx, svc.ID); err != nil {
			return nil, err
		}
		for _, n := range st.Members { // standbys first: the primary's shutdown checkpoint reaches them
			if n != st.Primary {
				if err := rt.mgr.Stop(ctx, rt.haSpec(svc, base, st, n), 30*time.Second); err != nil {
					return nil, err
				}
			}
		}
		if err := rt.mgr.Stop(ctx, rt.haSpec(svc, base, st, st.Primary), 30*time.Second); err != nil {
			return nil, err
		}
		obs.Instances = haInstances(svc, st)
		return obs, nil
	}

	// The primary: a dead one with a live standby is failed over.
	pspec := rt.haSpec(svc, base, st, st.Primary)
	if _, ok := rt.mgr.Running(pspec); !ok {
		if err := rt.recoverPrimary(ctx, svc, base, st); err != nil {
			return nil, err
		}
		pspec = rt.haSpec(svc, base, st, st.Primary)
	}
	if st.Primary == 0 {
		if err := rt.ensureForkData(ctx, svc, pspec); err != nil {
			return nil, err
		}
	}
	// A standby stops replaying while a setting of hotStandbyMinimums is
	// below the primary's, so a resize that raises one restarts the
	// standbys first; one that lowers them restarts the primary first (the
	// order below).
	if raise, err := rt.raisesStandbyMinimums(ctx, pspec); err != nil {
		return nil, err
	} else if raise {
		for _, n := range st.Members {
			if n == st.Primary || slices.Contains(remove, n) || slices.Contains(st.Rebuild, n) {
				continue
			}
			if spec := rt.haSpec(svc, base, st, n); rt.running(spec) {
				if err := rt.ensureInstance(ctx, spec); err != nil {
					return nil, err
				}
			}
		}
	}
	if err := rt.ensureInstance(ctx, pspec); err != nil {
		return nil, err
	}
	downSince.Delete(svc.ID)
	if err := rt.setProxy(ctx, svc.ID, rt.proxyListen(svc), net.JoinHostPort(rt.cfg.Host, strconv.Itoa(pspec.Port))); err != nil {
		return nil, err
	}

	// Removed standbys leave the synchronous set before they stop, so no
	// commit waits for them.
	if len(remove) > 0 {
		st.Sync = slices.DeleteFunc(st.Sync, func(n int) bool { return slices.Contains(remove, n) })
		st.SyncCount = min(st.SyncCount, len(st.Sync))
		if err := rt.saveHA(svc.ID, st); err != nil {
			return nil, err
		}
		if _, err := rt.mgr.Reload(ctx, rt.haSpec(svc, base, st, st.Primary)); err != nil {
			return nil, err
		}
		for _, n := range remove {
			spec := rt.haSpec(svc, base, st, n)
			if err := rt.mgr.Destroy(ctx, spec); err != nil {
				return nil, fmt.Errorf("remove standby %s: %w", spec.ID, err)
			}
			_ = rt.mgr.Exec(ctx, pspec, "postgres",
				"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slotName(n))
			st.Members = slices.DeleteFunc(st.Members, func(m int) bool { return m == n })
			st.Rebuild = slices.DeleteFunc(st.Rebuild, func(m int) bool { return m == n })
			delete(st.Ports, n)
			if err := rt.saveHA(svc.ID, st); err != nil {
				return nil, err
			}
		}
	}

	for _, n := range st.Members {
		if n == st.Primary {
			continue
		}
		if err := rt.ensureStandby(ctx, svc, base, st, n); err != nil {
			return nil, err
		}
	}
	if err := rt.updateSync(ctx, svc, base, st, streamingWait); err != nil {
		return nil, err
	}
	pspec = rt.haSpec(svc, base, st, st.Primary)
	// Writes on the primary come last: a commit waits for the synchronous
	// standbys, so they must stream again (or have been left out of the
	// synchronous set) first, or a dead one would hold the repair for good.
	if err := rt.servePrimary(ctx, svc, pspec, obs); err != nil {
		return nil, err
	}
	obs.Instances = haInstances(svc, st)
	return obs, nil
}

func (rt *Runtime) running(spec InstanceSpec) bool {
	_, ok := rt.mgr.Running(spec)
	return ok
}

// raisesStandbyMinimums reports whether spec asks for a higher value of a
// setting in hotStandbyMinimums than its running postmaster has.
func (rt *Runtime) raisesStandbyMinimums(ctx context.Context, spec InstanceSpec) (bool, error) {
	raise, _, err := rt.standbyMinimumsChange(ctx, spec)
	return raise, err
}

// standbyMinimumsChange compares spec's settings of hotStandbyMinimums with
// those of its running postmaster (none running: no change).
func (rt *Runtime) standbyMinimumsChange(ctx context.Context, spec InstanceSpec) (raise, lower bool, err error) {
	conn, err := rt.connectLive(ctx, spec)
	if conn == nil || err != nil {
		return false, false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SELECT name, setting FROM pg_settings WHERE name = ANY($1)", hotStandbyMinimums)
	if err != nil {
		return false, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var name, setting string
		if err := rows.Scan(&name, &setting); err != nil {
			return false, false, err
		}
		now, _ := strconv.Atoi(setting)
		if want, err := strconv.Atoi(spec.Settings[name]); err == nil {
			raise = raise || want > now
			lower = lower || want < now
		}
	}
	return raise, lower, rows.Err()
}

// connectLive connects to spec's running postmaster, which may still
// listen on another port than spec's (a service turning HA moves behind
// the proxy); nil when none runs.
func (rt *Runtime) connectLive(ctx context.Context, spec InstanceSpec) (*pgx.Conn, error) {
	if !rt.running(spec) {
		return nil, nil
	}
	live := spec
	if pf, err := readPidFile(spec.pgdata()); err == nil && pf.port > 0 {
		live.Port = pf.port
	}
	return rt.mgr.Connect(ctx, live, "postgres")
}

// restartpointPastParameters readies a running standby whose new settings
// lower a hot-standby minimum for its restart. Restarted as it is, it would
// replay again, from its last restartpoint, the primary's parameter-change
// record of the old, higher values and abort ("recovery aborted because of
// insufficient parameter settings"). A checkpoint on the primary (after its
// own restart with the lower values), replayed by the standby, and a
// restartpoint there move the standby's restart past that record.
func (rt *Runtime) restartpointPastParameters(ctx context.Context, primary, standby InstanceSpec) error {
	if _, lower, err := rt.standbyMinimumsChange(ctx, standby); err != nil || !lower || !rt.running(primary) {
		return err
	}
	var lsn string
	pc, err := rt.mgr.Connect(ctx, primary, "postgres")
	if err != nil {
		return err
	}
	if _, err = pc.Exec(ctx, "CHECKPOINT"); err == nil {
		err = pc.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	}
	pc.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("checkpoint on %s: %w", primary.ID, err)
	}
	sc, err := rt.connectLive(ctx, standby)
	if err != nil || sc == nil {
		return err
	}
	defer sc.Close(context.WithoutCancel(ctx))
	for deadline := time.Now().Add(streamingWait); ; {
		var replayed bool
		if err := sc.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", lsn).Scan(&replayed); err != nil {
			return err
		}
		if replayed {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("standby %s did not replay %s's checkpoint at %s within %v", standby.ID, primary.ID, lsn, streamingWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := sc.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("restartpoint on %s: %w", standby.ID, err)
	}
	return nil
}

// ensureInstance prepares, configures and starts an instance whose data
// directory exists (or, for a primary, comes from the pool), restarting it
// when a restart-only setting changed (the port, when a service turns HA).
func (rt *Runtime) ensureInstance(ctx context.Context, spec InstanceSpec) error {
	if err := rt.mgr.Prepare(ctx, spec); err != nil {
		return fmt.Errorf("prepare %s: %w", spec.ID, err)
	}
	if _, running := rt.mgr.Running(spec); running {
		restart, err := rt.mgr.Reload(ctx, spec)
		if err != nil {
			rt.cfg.Logger.Warn("reload failed; restarting the instance", "instance", spec.ID, "error", err)
			restart = true
		}
		if restart {
			rt.cfg.Logger.Info("restarting for new settings", "instance", spec.ID)
			if err := rt.mgr.Stop(ctx, spec, 30*time.Second); err != nil {
				return fmt.Errorf("stop %s for restart: %w", spec.ID, err)
			}
		}
	}
	if err := rt.mgr.SetLimits(spec); err != nil {
		return fmt.Errorf("limits of %s: %w", spec.ID, err)
	}
	if _, err := rt.mgr.Start(ctx, spec); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	return nil
}

// recoverPrimary handles a primary whose postmaster is not running. With
// no standby to take over (a new service, a stopped one), the primary is
// simply started again by the caller. Otherwise it gets failoverGrace to
// come back (its data directory gone: no grace), then a standby takes over.
func (rt *Runtime) recoverPrimary(ctx context.Context, svc *dbcloud.Service, base InstanceSpec, st *haState) error {
	pspec := rt.haSpec(svc, base, st, st.Primary)
	_, statErr := os.Stat(filepath.Join(pspec.pgdata(), "PG_VERSION"))
	dataGone := statErr != nil
	// Standbys that are stopped but intact are started first: they are
	// safe (read-only) and may be the only copy of the data.
	var candidates []int
	for _, n := range st.Members {
		if n == st.Primary || slices.Contains(st.Rebuild, n) {
			continue
		}
		spec := rt.haSpec(svc, base, st, n)
		if _, err := os.Stat(filepath.Join(spec.pgdata(), "standby.signal")); err != nil {
			continue // never built, or not a standby
		}
		if _, ok := rt.mgr.Running(spec); !ok {
			if err := rt.ensureInstance(ctx, spec); err != nil {
				rt.cfg.Logger.Warn("start standby", "instance", spec.ID, "error", err)
				continue
			}
		}
		candidates = append(candidates, n)
	}
	// With synchronous replicas asked for, a client was told a commit is
	// durable once a synchronous standby had it; any other standby may lack
	// it (while one is being built, or right after a failover, none is
	// synchronous and commits do not wait). Promoting one would lose
	// acknowledged commits that the old primary's intact data still holds:
	// that primary is started again instead.
	if !dataGone && svc.Spec.SyncReplicas > 0 {
		candidates = slices.DeleteFunc(candidates, func(n int) bool {
			return st.SyncCount == 0 || !slices.Contains(st.Sync, n)
		})
	}
	if len(candidates) == 0 {
		return nil
	}
	if !dataGone {
		since := time.Now()
		if v, ok := downSince.LoadOrStore(svc.ID, since); ok {
			since = v.(time.Time)
		}
		for time.Since(since) < failoverGrace {
			if _, ok := rt.mgr.Running(pspec); ok {
				return nil // it came back
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return rt.failover(ctx, svc, base, st, candidates)
}

// failover promotes the most advanced candidate standby. Order matters:
// the endpoint refuses connections first, then the old primary is fenced
// (nothing of it runs any more), and only then is a standby promoted and
// the endpoint pointed at it, so the endpoint never reaches two primaries.
func (rt *Runtime) failover(ctx context.Context, svc *dbcloud.Service, base InstanceSpec, st *haState, candidates []int) error {
	begin := time.Now()
	old := st.Primary
	oldSpec := rt.haSpec(svc, base, st, old)
	rt.cfg.Logger.Warn("primary down; failing over", "service", svc.ID, "primary", oldSpec.ID)
	if rt.proxyRunning(svc.ID) {
		if err := rt.setProxy(ctx, svc.ID, rt.proxyListen(svc)); err != nil {
			return fmt.Errorf("failover of %s: close endpoint: %w", svc.ID, err)
		}
	}
	// Fence: Stop kills whatever is left in the instance's cgroup (and in
	// its data directory) and waits until nothing is, which also covers a
	// postmaster still running on a deleted data directory.
	if err := rt.mgr.Stop(ctx, oldSpec, 5*time.Second); err != nil {
		return fmt.Errorf("failover of %s: fence %s: %w", svc.ID, oldSpec.ID, err)
	}
	if cg := rt.mgr.cgroupOf(oldSpec.ID); cg != nil && cg.exists() {
		if pids, err := cg.procs(); err != nil || len(pids) > 0 {
			return fmt.Errorf("failover of %s: fence %s: processes %v remain (%v)", svc.ID, oldSpec.ID, pids, err)
		}
	}
	// The most advanced standby by WAL received (flushed): with ANY n, every
	// acknowledged commit is on at least one standby, hence on this one.
	best, bestLSN := -1, int64(-1)
	for _, n := range candidates {
		spec := rt.haSpec(svc, base, st, n)
		lsn, err := rt.receivedLSN(ctx, spec)
		if err != nil {
			rt.cfg.Logger.Warn("read standby position", "instance", spec.ID, "error", err)
			continue
		}
		if lsn > bestLSN {
			best, bestLSN = n, lsn
		}
	}
	if best < 0 {
		return fmt.Errorf("failover of %s: no standby answers", svc.ID)
	}
	newSpec := rt.haSpec(svc, base, st, best)
	conn, err := rt.mgr.Connect(ctx, newSpec, "postgres")
	if err != nil {
		return fmt.Errorf("failover of %s: %w", svc.ID, err)
	}
	var promoted bool
	err = conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&promoted)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil || !promoted {
		return fmt.Errorf("failover of %s: promote %s: %v (promoted %v)", svc.ID, newSpec.ID, err, promoted)
	}
	st.Primary = best
	st.Sync, st.SyncCount = nil, 0 // until the others stream from it
	if !slices.Contains(st.Rebuild, old) {
		st.Rebuild = append(st.Rebuild, old)
	}
	if err := rt.saveHA(svc.ID, st); err != nil {
		return err
	}
	newSpec = rt.haSpec(svc, base, st, best)
	if _, err := rt.mgr.Reload(ctx, newSpec); err != nil {
		return fmt.Errorf("failover of %s: reconfigure %s: %w", svc.ID, newSpec.ID, err)
	}
	if err := rt.setProxy(ctx, svc.ID, rt.proxyListen(svc), net.JoinHostPort(rt.cfg.Host, strconv.Itoa(newSpec.Port))); err != nil {
		return fmt.Errorf("failover of %s: open endpoint: %w", svc.ID, err)
	}
	rt.cfg.Logger.Warn("failed over", "service", svc.ID, "from", oldSpec.ID, "to", newSpec.ID,
		"ms", time.Since(begin).Milliseconds())
	downSince.Delete(svc.ID)
	// pg_rewind reads the new timeline from the control file, which the
	// first checkpoint after promotion writes.
	if err := rt.mgr.Exec(ctx, newSpec, "postgres", "CHECKPOINT"); err != nil {
		rt.cfg.Logger.Warn("checkpoint after promotion", "instance", newSpec.ID, "error", err)
	}
	// The other standbys follow the new primary (the callers' ensureStandby
	// creates their slots and reloads their primary_conninfo).
	return nil
}

// receivedLSN is how much WAL a standby has safely received.
func (rt *Runtime) receivedLSN(ctx context.Context, spec InstanceSpec) (int64, error) {
	conn, err := rt.mgr.Connect(ctx, spec, "postgres")
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var lsn int64
	err = conn.QueryRow(ctx, `SELECT greatest(
		coalesce(pg_last_wal_receive_lsn() - '0/0', 0),
		coalesce(pg_last_wal_replay_lsn() - '0/0', 0))::bigint`).Scan(&lsn)
	return lsn, err
}

// ensureStandby makes instance n a running standby of the current primary:
// its slot exists, its data is a copy (rewound or fresh when it may have
// diverged) and its config names the current primary.
func (rt *Runtime) ensureStandby(ctx context.Context, svc *dbcloud.Service, base InstanceSpec, st *haState, n int) error {
	pspec := rt.haSpec(svc, base, st, st.Primary)
	spec := rt.haSpec(svc, base, st, n)
	if err := rt.mgr.Exec(ctx, pspec, "postgres",
		`SELECT pg_create_physical_replication_slot($1, true)
		 WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, slotName(n)); err != nil {
		return fmt.Errorf("slot for %s: %w", spec.ID, err)
	}
	_, statErr := os.Stat(filepath.Join(spec.pgdata(), "PG_VERSION"))
	switch {
	case slices.Contains(st.Rebuild, n):
		if err := rt.mgr.Stop(ctx, spec, 10*time.Second); err != nil {
			return err
		}
		if statErr != nil || rt.rewind(ctx, pspec, spec) != nil {
			if err := rt.clone(ctx, pspec, spec, appName(n)); err != nil {
				return err
			}
		}
		st.Rebuild = slices.DeleteFunc(st.Rebuild, func(m int) bool { return m == n })
		if err := rt.saveHA(svc.ID, st); err != nil {
			return err
		}
	case statErr != nil:
		if err := rt.clone(ctx, pspec, spec, appName(n)); err != nil {
			return err
		}
	}
	// A standby, never a second primary: the signal file is checked before
	// every start.
	if err := rt.writeStandbySignal(spec); err != nil {
		return err
	}
	if err := rt.restartpointPastParameters(ctx, pspec, spec); err != nil {
		return err
	}
	return rt.ensureInstance(ctx, spec)
}

func (rt *Runtime) writeStandbySignal(spec InstanceSpec) error {
	path := filepath.Join(spec.pgdata(), "standby.signal")
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return err
	}
	return rt.mgr.chown(path)
}

// serverCommand runs a PostgreSQL client tool as the server's OS user, so
// what it writes belongs to that user.
func (rt *Runtime) serverCommand(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(rt.cfg.BinDir, name), args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", "PGCONNECT_TIMEOUT=10"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: rt.mgr.cred}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// clone makes spec's data directory a fresh base backup of the primary,
// streamed over its unix socket and built beside it, renamed into place
// only when complete. app names the copy in the primary's views.
func (rt *Runtime) clone(ctx context.Context, primary, spec InstanceSpec, app string) error {
	begin := time.Now()
	if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(spec.Dir, 0o755); err != nil {
		return err
	}
	work := filepath.Join(spec.Dir, ".clone")
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := rt.mgr.makeServerDir(work); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := rt.serverCommand(ctx, "pg_basebackup", "-D", work, "-h", primary.runDir(), "-p", strconv.Itoa(primary.Port),
		"-U", "postgres", "-w", "-c", "fast", "-X", "stream", "-d", "application_name="+app); err != nil {
		return fmt.Errorf("copy %s for %s: %w", primary.ID, spec.ID, err)
	}
	if err := os.RemoveAll(spec.pgdata()); err != nil {
		return err
	}
	if err := os.Rename(work, spec.pgdata()); err != nil {
		return err
	}
	if err := syncDir(spec.Dir); err != nil {
		return err
	}
	rt.cfg.Logger.Info("standby copied", "instance", spec.ID, "from", primary.ID, "ms", time.Since(begin).Milliseconds())
	return rt.writeStandbySignal(spec)
}

// rewind makes a former primary's data directory follow the new primary's
// timeline by copying only what diverged.
func (rt *Runtime) rewind(ctx context.Context, primary, spec InstanceSpec) error {
	begin := time.Now()
	// pg_rewind first completes the target's crash recovery in single-user
	// mode, which reads the data directory's own postgresql.conf (ours is
	// in Dir/conf): without wal_log_hints there, pg_rewind refuses.
	f, err := os.OpenFile(filepath.Join(spec.pgdata(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString("\n# dbcloud: pg_rewind's single-user recovery\nwal_log_hints = on\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := rt.mgr.chown(filepath.Join(spec.pgdata(), "postgresql.conf")); err != nil {
		return err
	}
	src := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", quoteDSN(primary.runDir()), primary.Port)
	if err := rt.serverCommand(ctx, "pg_rewind", "--target-pgdata="+spec.pgdata(), "--source-server="+src); err != nil {
		rt.cfg.Logger.Warn("rewind failed; copying instead", "instance", spec.ID, "error", err)
		return err
	}
	rt.cfg.Logger.Info("former primary rewound", "instance", spec.ID, "ms", time.Since(begin).Milliseconds())
	return rt.writeStandbySignal(spec)
}

// updateSync names in synchronous_standby_names the standbys that stream
// from the primary now (waiting up to wait for all of them), never more
// than are healthy: with 'ANY n' and fewer than n connected, commits block.
func (rt *Runtime) updateSync(ctx context.Context, svc *dbcloud.Service, base InstanceSpec, st *haState, wait time.Duration) error {
	pspec := rt.haSpec(svc, base, st, st.Primary)
	var healthy []int
	deadline := time.Now().Add(wait)
	for {
		senders, err := rt.walSenders(ctx, pspec)
		if err != nil {
			return err
		}
		healthy = healthy[:0]
		for _, n := range st.Members {
			if n != st.Primary && senders[appName(n)] == "streaming" {
				healthy = append(healthy, n)
			}
		}
		if len(healthy) == len(st.Members)-1 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	count := min(svc.Spec.SyncReplicas, len(healthy))
	sync := healthy
	if count == 0 {
		sync = nil
	}
	if count == st.SyncCount && slices.Equal(sync, st.Sync) {
		return nil
	}
	st.Sync, st.SyncCount = slices.Clone(sync), count
	if err := rt.saveHA(svc.ID, st); err != nil {
		return err
	}
	if _, err := rt.mgr.Reload(ctx, rt.haSpec(svc, base, st, st.Primary)); err != nil {
		return err
	}
	rt.cfg.Logger.Info("synchronous standbys set", "service", svc.ID, "count", count, "standbys", fmt.Sprint(sync))
	return nil
}

// walSenders returns the state (startup, catchup, streaming, ...) of every
// standby connected to the primary, by application name.
func (rt *Runtime) walSenders(ctx context.Context, primary InstanceSpec) (map[string]string, error) {
	conn, err := rt.mgr.Connect(ctx, primary, "postgres")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SELECT application_name, state FROM pg_stat_replication")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, state string
		if err := rows.Scan(&name, &state); err != nil {
			return nil, err
		}
		out[name] = state
	}
	return out, rows.Err()
}

// checkHA is CheckService for an HA service: the primary, the endpoint
// proxy and every standby must run; a dead primary starts the grace after
// which the repair fails over.
func (rt *Runtime) checkHA(ctx context.Context, svc *dbcloud.Service, measure bool) (*dbcloud.Observation, error) {
	base, err := rt.primary(svc)
	if err != nil {
		return nil, err
	}
	st, err := rt.loadHA(svc.ID)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return &dbcloud.Observation{Reason: "The service is becoming highly available."}, nil
	}
	obs := &dbcloud.Observation{Instances: haInstances(svc, st)}
	pspec := rt.haSpec(svc, base, st, st.Primary)
	if _, ok := rt.mgr.Running(pspec); !ok {
		downSince.LoadOrStore(svc.ID, time.Now())
		obs.Reason = fmt.Sprintf("The primary (%s) is not running; failing over to a standby if it does not come back.", pspec.ID)
		return obs, nil
	}
	if !rt.proxyRunning(svc.ID) {
		obs.Reason = "The endpoint proxy is not running; restarting it."
		return obs, nil
	}
	if len(st.Members) != svc.Spec.Replicas+1 || len(st.Rebuild) > 0 {
		obs.Reason = "Replicas are being added, removed or rebuilt."
		return obs, nil
	}
	for _, n := range st.Members {
		if n == st.Primary {
			continue
		}
		if _, ok := rt.mgr.Running(rt.haSpec(svc, base, st, n)); !ok {
			obs.Reason = fmt.Sprintf("Standby %s-%d is not running; restarting it.", svc.ID, n)
			return obs, nil
		}
	}
	if svc.Spec.Pooler && !rt.poolerRunning(svc.ID) {
		obs.Reason = "The connection pooler is not running; restarting it."
		return obs, nil
	}
	obs.Running = true
	if measure {
		obs.Metrics = rt.metrics(svc.ID, pspec)
	}
	return obs, nil
}
