package postgres

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/internal/cgroup"
	"dbcloud/runtime/local/internal/proc"
)

// PidFile is what postmaster.pid says (PG 10+ layout). It is the one
// reader of that file.
type PidFile struct {
	PID  int
	Port int // line 4: the port it listens on
	// Status is line 8: "starting", "stopping", "ready" or "standby".
	Status string
}

// ReadPidFile reads pgdata/postmaster.pid. The data directory is the
// service's OS user's: a link or a FIFO there is an error, never followed
// or waited on (a FIFO once held the health loop for minutes).
func ReadPidFile(pgdata string) (PidFile, error) {
	data, err := tenantfs.ReadFile(filepath.Join(pgdata, "postmaster.pid"))
	if err != nil {
		return PidFile{}, err
	}
	lines := strings.Split(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		return PidFile{}, fmt.Errorf("postmaster.pid: bad pid %q", lines[0])
	}
	pf := PidFile{PID: pid}
	if len(lines) > 3 {
		pf.Port, _ = strconv.Atoi(strings.TrimSpace(lines[3]))
	}
	if len(lines) > 7 {
		pf.Status = strings.TrimSpace(lines[7])
	}
	return pf, nil
}

// Running reports whether a live postmaster serves the data directory, and
// its PID.
func (m *Instances) Running(s Spec) (pid int, ok bool) {
	pf, ok := m.Live(s)
	return pf.PID, ok
}

// Live returns the pid file of the postmaster serving the data directory,
// if one runs. It trusts postmaster.pid only as far as the process it
// names: that process must exist, not be a zombie (a killed postmaster
// stays one until its parent reaps it), and be a postgres whose working
// directory is this data directory (the postmaster chdirs there), not a
// process that reused the PID.
func (m *Instances) Live(s Spec) (PidFile, bool) {
	pf, err := ReadPidFile(s.PGData())
	if err != nil {
		return PidFile{}, false
	}
	real, err := filepath.EvalSymlinks(s.PGData())
	if err != nil || !m.sup.Live(pf.PID, func(pid int) bool { return servesDataDir(pid, real) }) {
		return PidFile{}, false
	}
	return pf, true
}

// servesDataDir reports whether pid runs the postgres binary with the data
// directory (a path with symlinks resolved) as its working directory. Every
// PostgreSQL process chdirs into its data directory, so this identifies the
// cluster without trusting argv.
func servesDataDir(pid int, pgdata string) bool {
	return strings.HasPrefix(filepath.Base(proc.Exe(pid)), "postgres") && proc.Cwd(pid) == pgdata
}

// serverProcesses finds the live postgres processes of a data directory,
// whichever cgroup they are in: the fallback when cgroups are unavailable,
// and a check that nothing escaped them.
func serverProcesses(pgdata string) []int {
	real, err := filepath.EvalSymlinks(pgdata)
	if err != nil {
		return nil // no data directory, no server
	}
	return proc.Find(func(pid int) bool { return servesDataDir(pid, real) })
}

// moveTree moves a running postmaster and the children it already forked
// into cg (backends make themselves session leaders, so the process group
// holds only the postmaster; the tree is found by parent PID).
func (m *Instances) moveTree(cg *cgroup.Group, root int) {
	for _, pid := range proc.Tree(root) {
		if err := cg.Add(pid); err != nil && proc.Alive(pid) {
			m.Logger.Warn("move process into cgroup", "pid", pid, "error", err)
		}
	}
}

// Children returns the live children of the instance's postmaster pid
// (not zombies: exited and not reaped yet). They are looked for among the
// processes of its cgroup, a few, where it has one, else in all of /proc.
func (m *Instances) Children(s Spec, postmaster int) []int {
	candidates := proc.All()
	if cg := m.cgroups.Of(s.ID); cg != nil && cg.Exists() {
		if pids, err := cg.Procs(); err == nil {
			candidates = pids
		}
	}
	var out []int
	for _, pid := range candidates {
		if state, ppid, err := proc.State(pid); err == nil && ppid == postmaster && state != 'Z' && state != 'X' {
			out = append(out, pid)
		}
	}
	return out
}
