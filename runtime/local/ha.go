package local

import (
	"context"
	"fmt"
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

	"dbcloud"
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
	// promoteTimeout bounds a standby's promotion (pg_promote's default).
	promoteTimeout = 60 * time.Second
)

// haState is the service's HA layout, written atomically.
type haState struct {
	// Primary is the instance number of the current primary.
	Primary int `json:"primary"`
	// Members are the instance numbers, primary included, ascending.
	Members []int `json:"members"`
	instancePorts
	// Sync are the standbys named in synchronous_standby_names and
	// SyncCount the n of 'ANY n (...)': only standbys seen streaming.
	Sync      []int `json:"sync,omitempty"`
	SyncCount int   `json:"sync_count,omitempty"`
	// Rebuild are members whose data may have diverged from the primary's
	// (a former primary): they are rewound or copied before they start.
	Rebuild []int `json:"rebuild,omitempty"`
	// Logical makes the primary write logical WAL (wal_level logical):
	// a BLUE_GREEN upgrade replicates from it to the new cluster.
	Logical bool `json:"logical,omitempty"`
}

func (rt *Runtime) haPath(serviceID string) string {
	return filepath.Join(rt.serviceDir(serviceID), haStateFile)
}

// loadHA returns the service's HA state, nil if it never had replicas.
func (rt *Runtime) loadHA(serviceID string) (*haState, error) {
	return readState[haState](rt.haPath(serviceID))
}

func (rt *Runtime) saveHA(serviceID string, st *haState) error {
	slices.Sort(st.Members)
	return writeState(rt.haPath(serviceID), st)
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

// currentPrimary turns base (instance 0 on the endpoint port) into the spec
// of the current primary when the service is HA. It reads ha.json.
func (rt *Runtime) currentPrimary(svc *dbcloud.Service, base postgres.Spec) (postgres.Spec, error) {
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
func (rt *Runtime) haSpec(svc *dbcloud.Service, base postgres.Spec, st *haState, n int) postgres.Spec {
	s := base
	s.ID = svc.ID + "-" + strconv.Itoa(n)
	s.Dir = filepath.Join(rt.serviceDir(svc.ID), strconv.Itoa(n))
	s.Port = st.Ports[n]
	s.ListenAddr = rt.listenAddr() // the proxy serves the VPC address
	s.Settings = rt.storageSettings(svc.ID, rt.cfg.StorageLimits.Of(svc.Spec.Size), sizing.WithAddons(sizing.For(svc.Spec.Size), svc.Spec.Addons))
	s.Settings["wal_log_hints"] = "on" // pg_rewind of a former primary
	s.Settings["hot_standby"] = "on"
	if rt.logicalWAL(svc.ID) {
		// Every member, so that a promoted standby needs no restart.
		s.Settings["wal_level"] = "logical"
	}
	if n == st.Primary {
		if st.Logical {
			s.Settings["wal_level"] = "logical"
		}
		if st.SyncCount > 0 && len(st.Sync) > 0 {
			names := make([]string, len(st.Sync))
			for i, m := range st.Sync {
				names[i] = `"` + appName(m) + `"`
			}
			s.Settings["synchronous_standby_names"] = fmt.Sprintf("ANY %d (%s)", st.SyncCount, strings.Join(names, ", "))
		}
		return s
	}
	s.RestoreFromArchive = true
	primaryDir := filepath.Join(rt.serviceDir(svc.ID), strconv.Itoa(st.Primary))
	s.Settings["primary_conninfo"] = fmt.Sprintf("host=%s port=%d user="+postgres.ReplicatorRole+" application_name=%s",
		postgres.QuoteDSN(filepath.Join(primaryDir, "run")), st.Ports[st.Primary], appName(n))
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
	base, err := rt.preparedBase(ctx, svc)
	if err != nil {
		return nil, err
	}
	st, err := rt.loadHA(svc.ID)
	if err != nil {
		return nil, err
	}
	if st == nil {
		st = &haState{Primary: 0, Members: []int{0}, instancePorts: newInstancePorts()}
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
	// The primary may be stopped or restarted on purpose below: its exit
	// is no failure. The watch starts again once the service is served.
	rt.unwatchPrimary(svc.ID)
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
				if err := rt.stopInstance(ctx, rt.haSpec(svc, base, st, n), 30*time.Second); err != nil {
					return nil, err
				}
			}
		}
		if err := rt.stopInstance(ctx, rt.haSpec(svc, base, st, st.Primary), 30*time.Second); err != nil {
			return nil, err
		}
		obs.Instances = haInstances(svc, st)
		return obs, nil
	}

	// The primary: a dead one with a live standby is failed over.
	pspec := rt.haSpec(svc, base, st, st.Primary)
	if _, ok := rt.instances.Running(pspec); !ok {
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
	// A standby stops replaying while a setting of postgres.HotStandbyMinimums() is
	// below the primary's, so a resize that raises one restarts the
	// standbys first; one that lowers them restarts the primary first (the
	// order below).
	if raise, err := rt.instances.RaisesStandbyMinimums(ctx, pspec); err != nil {
		return nil, err
	} else if raise {
		for _, n := range st.Members {
			if n == st.Primary || slices.Contains(remove, n) || slices.Contains(st.Rebuild, n) {
				continue
			}
			if spec := rt.haSpec(svc, base, st, n); rt.running(spec) {
				if err := rt.instances.Ensure(ctx, spec); err != nil {
					return nil, err
				}
			}
		}
	}
	if err := rt.instances.Ensure(ctx, pspec); err != nil {
		return nil, err
	}
	rt.primaryUp(svc.ID)
	if err := rt.setProxy(ctx, svc.ID, pspec.Owner, rt.proxyListen(svc), net.JoinHostPort(rt.cfg.Host, strconv.Itoa(pspec.Port))); err != nil {
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
		if _, err := rt.instances.Reload(ctx, rt.haSpec(svc, base, st, st.Primary)); err != nil {
			return nil, err
		}
		for _, n := range remove {
			spec := rt.haSpec(svc, base, st, n)
			if err := rt.instances.Destroy(ctx, spec); err != nil {
				return nil, fmt.Errorf("remove standby %s: %w", spec.ID, err)
			}
			_ = rt.instances.Exec(ctx, pspec, "postgres",
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
	if err := rt.updateSync(ctx, svc, base, st, postgres.StreamingWait); err != nil {
		return nil, err
	}
	pspec = rt.haSpec(svc, base, st, st.Primary)
	// Writes on the primary come last: a commit waits for the synchronous
	// standbys, so they must stream again (or have been left out of the
	// synchronous set) first, or a dead one would hold the repair for good.
	if err := rt.servePrimary(ctx, svc, pspec, obs); err != nil {
		return nil, err
	}
	if pid, ok := rt.instances.Running(pspec); ok {
		rt.watchPrimary(svc, pspec, pid)
	}
	obs.Instances = haInstances(svc, st)
	return obs, nil
}

func (rt *Runtime) running(spec postgres.Spec) bool {
	_, ok := rt.instances.Running(spec)
	return ok
}

// ensureStandby makes instance n a running standby of the current primary:
// its slot exists, its data is a copy (rewound or fresh when it may have
// diverged) and its config names the current primary.
func (rt *Runtime) ensureStandby(ctx context.Context, svc *dbcloud.Service, base postgres.Spec, st *haState, n int) error {
	pspec := rt.haSpec(svc, base, st, st.Primary)
	spec := rt.haSpec(svc, base, st, n)
	if err := rt.instances.CreateSlot(ctx, pspec, slotName(n)); err != nil {
		return err
	}
	_, statErr := tenantfs.Lstat(filepath.Join(spec.PGData(), "PG_VERSION"))
	switch {
	case slices.Contains(st.Rebuild, n):
		if err := rt.stopInstance(ctx, spec, 10*time.Second); err != nil {
			return err
		}
		if statErr != nil || rt.instances.Rewind(ctx, pspec, spec) != nil {
			if err := rt.instances.Clone(ctx, pspec, spec, appName(n)); err != nil {
				return err
			}
		}
		st.Rebuild = slices.DeleteFunc(st.Rebuild, func(m int) bool { return m == n })
		if err := rt.saveHA(svc.ID, st); err != nil {
			return err
		}
	case statErr != nil:
		if err := rt.instances.Clone(ctx, pspec, spec, appName(n)); err != nil {
			return err
		}
	}
	// A standby, never a second primary: the signal file is checked before
	// every start.
	if err := rt.instances.WriteStandbySignal(spec); err != nil {
		return err
	}
	if err := rt.instances.RestartpointPastParameters(ctx, pspec, spec); err != nil {
		return err
	}
	return rt.instances.Ensure(ctx, spec)
}

// updateSync names in synchronous_standby_names the standbys that stream
// from the primary now (waiting up to wait for all of them), never more
// than are healthy: with 'ANY n' and fewer than n connected, commits block.
func (rt *Runtime) updateSync(ctx context.Context, svc *dbcloud.Service, base postgres.Spec, st *haState, wait time.Duration) error {
	pspec := rt.haSpec(svc, base, st, st.Primary)
	var healthy []int
	deadline := time.Now().Add(wait)
	for {
		senders, err := rt.instances.WALSenders(ctx, pspec)
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
	if _, err := rt.instances.Reload(ctx, rt.haSpec(svc, base, st, st.Primary)); err != nil {
		return err
	}
	rt.cfg.Logger.Info("synchronous standbys set", "service", svc.ID, "count", count, "standbys", fmt.Sprint(sync))
	return nil
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
	pid, ok := rt.instances.Running(pspec)
	if !ok {
		rt.primaryDown(svc.ID)
		obs.Reason = fmt.Sprintf("The primary (%s) is not running; failing over to a standby if it does not come back.", pspec.ID)
		if rt.exitSeen(svc.ID, pspec) {
			obs.Reason = fmt.Sprintf("The primary's postmaster (%s) exited; failing over to a standby.", pspec.ID)
		}
		return obs, nil
	}
	// Watched from here on too: a primary adopted after a restart of
	// dbcloud, or one whose earlier watch ended.
	rt.watchPrimary(svc, pspec, pid)
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
		if _, ok := rt.instances.Running(rt.haSpec(svc, base, st, n)); !ok {
			obs.Reason = fmt.Sprintf("Standby %s-%d is not running; restarting it.", svc.ID, n)
			return obs, nil
		}
	}
	return rt.checkServing(ctx, svc, pspec, obs, measure), nil
}
