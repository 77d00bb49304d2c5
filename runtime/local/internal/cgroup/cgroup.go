// Package cgroup confines the runtime's processes: one group per instance
// (postmaster, PgBouncer) with a CPU quota and a memory limit, and the
// usage read back from it. It speaks cgroup v1 with the cpu, cpuacct and
// memory controllers, mounted together or apart; a v2-only host has no
// usable hierarchy here and its instances run without limits (logged once).
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"dbcloud/runtime/local/internal/proc"
)

// Parent is the group under which every instance gets its own group, at
// the root of each hierarchy rather than under dbcloud's own group: a
// restart of dbcloud (for example by systemd, which kills its unit's whole
// group) must not take the instances with it.
const Parent = "dbcloud"

// cfsPeriod is the CPU bandwidth period; a quota of cpu_millis*100 µs per
// 100 ms gives cpu_millis/1000 CPUs.
const cfsPeriod = 100000

// controllers are the cgroup v1 controllers a group spans: cpu for the
// quota, cpuacct for CPU usage, memory for the limit and the working set.
func controllers() []string { return []string{"cpu", "cpuacct", "memory"} }

// Mounts maps a controller to the mount point of its hierarchy.
type Mounts map[string]string

// FindMounts reads the cgroup v1 mount point of every controller a group
// needs from /proc/self/mountinfo. Controllers mounted together
// (cpu,cpuacct) share a mount point. A controller missing from the result
// is not mounted as cgroup v1.
func FindMounts(mountinfo io.Reader) Mounts {
	mounts := Mounts{}
	wanted := controllers()
	sc := bufio.NewScanner(mountinfo)
	for sc.Scan() {
		// "36 25 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, postFields := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(postFields) < 3 || postFields[0] != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(postFields[2], ",") {
			if slices.Contains(wanted, opt) {
				if _, dup := mounts[opt]; !dup {
					mounts[opt] = unescapeMountPath(fields[4])
				}
			}
		}
	}
	return mounts
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(p string) string {
	if !strings.Contains(p, `\`) {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' && i+3 < len(p) {
			if n, err := strconv.ParseUint(p[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// Hierarchy is the host's cgroup mounts, where groups are made.
type Hierarchy struct {
	mounts Mounts
	logger *slog.Logger
	warn   sync.Once
}

// NewHierarchy reads the mounts of this host.
func NewHierarchy(logger *slog.Logger) *Hierarchy {
	mounts := Mounts{}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		mounts = FindMounts(f)
		f.Close()
	}
	return NewHierarchyAt(mounts, logger)
}

// NewHierarchyAt uses the given mounts (tests).
func NewHierarchyAt(mounts Mounts, logger *slog.Logger) *Hierarchy {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Hierarchy{mounts: mounts, logger: logger}
}

// Group is one instance's group, dbcloud/<id>, in each hierarchy.
type Group struct {
	dirs   map[string]string // controller -> directory
	mounts Mounts
}

// Of returns the group's paths without creating anything, or nil when the
// controllers are not all mounted.
func (h *Hierarchy) Of(id string) *Group {
	if len(h.mounts) != len(controllers()) {
		return nil
	}
	g := &Group{dirs: map[string]string{}, mounts: h.mounts}
	for _, c := range controllers() {
		g.dirs[c] = filepath.Join(h.mounts[c], Parent, id)
	}
	return g
}

// Existing returns the group when it was created, else nil.
func (h *Hierarchy) Existing(id string) *Group {
	if g := h.Of(id); g != nil && g.Exists() {
		return g
	}
	return nil
}

// Ensure creates the group in every hierarchy and lets owner (nil: only
// dbcloud's user) write its cgroup.procs, so a process started as owner
// can join the group itself before it runs. It returns nil, having logged
// once, when cgroups cannot be used on this host: instances then run
// without limits rather than not at all.
func (h *Hierarchy) Ensure(id string, owner *syscall.Credential) *Group {
	g := h.Of(id)
	if g == nil {
		h.warn.Do(func() {
			h.logger.Warn("cgroup v1 cpu, cpuacct and memory controllers not all mounted; instances run without CPU and memory limits",
				"found", fmt.Sprint(h.mounts))
		})
		return nil
	}
	for _, dir := range g.uniqueDirs() {
		err := os.MkdirAll(dir, 0o755)
		if err == nil && owner != nil {
			err = os.Chown(filepath.Join(dir, "cgroup.procs"), int(owner.Uid), int(owner.Gid))
		}
		if err != nil {
			h.warn.Do(func() {
				h.logger.Warn("cgroups not writable; instances run without CPU and memory limits", "error", err)
			})
			return nil
		}
	}
	return g
}

// Exists reports whether the group was created (in the memory hierarchy,
// the one that matters for reading usage).
func (g *Group) Exists() bool {
	_, err := os.Stat(g.dirs["memory"])
	return err == nil
}

func (g *Group) uniqueDirs() []string {
	var dirs []string
	for _, c := range controllers() {
		if !slices.Contains(dirs, g.dirs[c]) {
			dirs = append(dirs, g.dirs[c])
		}
	}
	return dirs
}

// ProcsFiles lists the cgroup.procs file of every hierarchy.
func (g *Group) ProcsFiles() []string {
	var files []string
	for _, dir := range g.uniqueDirs() {
		files = append(files, filepath.Join(dir, "cgroup.procs"))
	}
	return files
}

// Add moves a process (all its threads) into the group. Its later children
// are born inside; children it already has are not moved.
func (g *Group) Add(pid int) error {
	for _, f := range g.ProcsFiles() {
		if err := proc.WriteControlFile(f, strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// Contains reports whether pid is in the group of every hierarchy, from
// /proc/PID/cgroup ("4:memory:/dbcloud/x").
func (g *Group) Contains(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	in := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if dir, ok := g.dirs[c]; ok && filepath.Join(g.mounts[c], parts[2]) == dir {
				in[c] = true
			}
		}
	}
	return len(in) == len(g.dirs)
}

// Procs returns the live processes in the group, in any hierarchy. Zombies
// are left out: they hold no resources and cannot be killed again.
func (g *Group) Procs() ([]int, error) {
	var pids []int
	for _, f := range g.ProcsFiles() {
		data, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, field := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(field)
			if err == nil && !slices.Contains(pids, pid) && proc.Alive(pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}

// SetLimits applies a CPU quota and a memory limit; zero means unlimited.
// Both take effect immediately for running processes.
func (g *Group) SetLimits(cpuMillis int, memoryBytes int64) error {
	cpu := g.dirs["cpu"]
	quota, shares := "-1", "1024"
	if cpuMillis > 0 {
		quota = strconv.Itoa(cpuMillis * cfsPeriod / 1000)
		shares = strconv.Itoa(max(2, cpuMillis*1024/1000))
	}
	limit := "-1"
	if memoryBytes > 0 {
		limit = strconv.FormatInt(memoryBytes, 10)
	}
	for _, w := range []struct{ file, value string }{
		{filepath.Join(cpu, "cpu.cfs_period_us"), strconv.Itoa(cfsPeriod)},
		{filepath.Join(cpu, "cpu.cfs_quota_us"), quota},
		{filepath.Join(cpu, "cpu.shares"), shares},
		{filepath.Join(g.dirs["memory"], "memory.limit_in_bytes"), limit},
	} {
		if err := proc.WriteControlFile(w.file, w.value); err != nil {
			return err
		}
	}
	return nil
}

// Usage reads the CPU time consumed by the group so far and its memory
// working set: usage minus inactive page cache, which the kernel reclaims
// before it would OOM-kill anything (what kubelet and cAdvisor report).
func (g *Group) Usage() (cpuNanos uint64, memoryBytes int64, err error) {
	raw, err := os.ReadFile(filepath.Join(g.dirs["cpuacct"], "cpuacct.usage"))
	if err != nil {
		return 0, 0, err
	}
	if cpuNanos, err = strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("parse cpuacct.usage: %w", err)
	}
	mem := g.dirs["memory"]
	raw, err = os.ReadFile(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return 0, 0, err
	}
	used, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("parse memory.usage_in_bytes: %w", err)
	}
	stat, err := os.ReadFile(filepath.Join(mem, "memory.stat"))
	if err != nil {
		return 0, 0, err
	}
	var inactive int64
	for _, line := range strings.Split(string(stat), "\n") {
		if v, ok := strings.CutPrefix(line, "total_inactive_file "); ok {
			inactive, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return cpuNanos, max(0, used-inactive), nil
}

// Remove deletes the group from every hierarchy. The group must be empty;
// a group whose last process just exited can report EBUSY for a moment.
func (g *Group) Remove(deadline time.Time) error {
	for _, dir := range g.uniqueDirs() {
		for {
			err := syscall.Rmdir(dir)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("remove cgroup %s: %w", dir, err)
			}
			time.Sleep(proc.PollInterval)
		}
	}
	return nil
}

// Dir is the group's directory in the hierarchy of controller ("cpu",
// "cpuacct" or "memory").
func (g *Group) Dir(controller string) string { return g.dirs[controller] }
