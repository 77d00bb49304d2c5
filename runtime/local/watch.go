package local

import (
	"sync"

	"dbcloud"

	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"
)

// An HA service's primary is watched through its postmaster's pidfd
// (proc.WatchExit): its exit is seen as it happens, and the engine told at
// once (dbcloud.FailureWatcher), so a failover starts from the failure and
// not from the next health check. The watch is only a trigger: the check
// and the repair confirm, under the service's lease, that the primary is
// gone before anything is done, and a primary whose exit was seen needs no
// grace to come back (failover.go).

// primaryWatches is the runtime's set of watched primaries.
type primaryWatches struct {
	mu     sync.Mutex
	notify func(projectID, serviceID string)
	// watching is, per service, the PID of the watched postmaster and the
	// function that ends its watch.
	watching map[string]primaryWatch
	// exited is, per service, the PID of a primary's postmaster seen to
	// exit, until the service is repaired.
	exited map[string]int
}

type primaryWatch struct {
	project string
	pid     int
	stop    func()
}

// WatchFailures implements dbcloud.FailureWatcher.
func (rt *Runtime) WatchFailures(notify func(projectID, serviceID string)) {
	rt.watches.mu.Lock()
	defer rt.watches.mu.Unlock()
	rt.watches.notify = notify
}

// watchPrimary watches the postmaster of spec (pid), the service's running
// primary, unless it already is; a watch of an earlier postmaster ends.
func (rt *Runtime) watchPrimary(svc *dbcloud.Service, spec postgres.Spec, pid int) {
	serviceID := svc.ID
	w := &rt.watches
	w.mu.Lock()
	cur, ok := w.watching[serviceID]
	w.mu.Unlock()
	if ok && cur.pid == pid {
		return
	}
	stop, err := proc.WatchExit(pid, func() { rt.primaryExited(serviceID, pid) })
	if err != nil {
		rt.cfg.Logger.Warn("watch primary", "service", serviceID, "instance", spec.ID, "pid", pid, "error", err)
		return
	}
	// Checked again once the pidfd is open: it is this data directory's
	// postmaster, not a process that took its PID meanwhile.
	if now, ok := rt.instances.Running(spec); !ok || now != pid {
		stop()
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.watching[serviceID]; ok {
		old.stop()
	}
	if w.watching == nil {
		w.watching = map[string]primaryWatch{}
	}
	w.watching[serviceID] = primaryWatch{project: svc.ProjectID, pid: pid, stop: stop}
}

// unwatchPrimary ends the watch of the service's primary: before the
// runtime stops or restarts it on purpose, whose exit is no failure.
func (rt *Runtime) unwatchPrimary(serviceID string) {
	w := &rt.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	if cur, ok := w.watching[serviceID]; ok {
		cur.stop()
		delete(w.watching, serviceID)
	}
}

// primaryExited records that the watched postmaster pid of the service
// exited and tells the engine.
func (rt *Runtime) primaryExited(serviceID string, pid int) {
	w := &rt.watches
	w.mu.Lock()
	cur, ok := w.watching[serviceID]
	if !ok || cur.pid != pid { // unwatched or replaced meanwhile
		w.mu.Unlock()
		return
	}
	cur.stop()
	delete(w.watching, serviceID)
	if w.exited == nil {
		w.exited = map[string]int{}
	}
	w.exited[serviceID] = pid
	notify := w.notify
	w.mu.Unlock()
	rt.cfg.Logger.Warn("primary postmaster exited", "service", serviceID, "pid", pid)
	if notify != nil {
		notify(cur.project, serviceID)
	}
}

// exitSeen reports whether the postmaster that last served spec's data
// directory, the one its postmaster.pid names, is the one seen to exit:
// the primary is certainly gone, and no grace can bring it back.
func (rt *Runtime) exitSeen(serviceID string, spec postgres.Spec) bool {
	w := &rt.watches
	w.mu.Lock()
	pid := w.exited[serviceID]
	w.mu.Unlock()
	if pid == 0 {
		return false
	}
	pf, err := postgres.ReadPidFile(spec.PGData())
	return err == nil && pf.PID == pid && !proc.Alive(pid)
}

// forgetExit forgets a seen exit once the service has a running primary.
func (rt *Runtime) forgetExit(serviceID string) {
	w := &rt.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.exited, serviceID)
}

// closeWatches ends every watch (the runtime closes).
func (rt *Runtime) closeWatches() {
	w := &rt.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, cur := range w.watching {
		cur.stop()
		delete(w.watching, id)
	}
}
