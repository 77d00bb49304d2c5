// Package cgroup confines the runtime's processes: one group per instance
// (postmaster, PgBouncer) with a CPU quota and a memory limit, and the
// usage read back from it. It speaks both cgroup versions: v1 with the cpu,
// cpuacct and memory controllers mounted together or apart (what these
// hosts run), and v2, the unified hierarchy most current distributions boot
// with, where a process is spawned straight into its group. A host with
// neither has no groups: its instances run without limits (logged once).
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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

// pidsController caps how many processes a group may have, so a tenant
// who runs programs on the server cannot fork-bomb the host. It is used
// where mounted (v1) or offered (v2); a host without it keeps its CPU and
// memory limits.
const pidsController = "pids"

// PidsMax is each group's process limit: far above what a postmaster
// needs (a backend per connection, at most 100, plus its workers and
// auxiliary processes; PgBouncer is one process), far below what would
// exhaust the host's PIDs.
const PidsMax = 512

// Mounts says where the hierarchies are: a v1 controller's mount point by
// controller name, and the v2 (unified) mount point under the key "".
type Mounts map[string]string

// unified is the key of the v2 mount in Mounts.
const unified = ""

// FindMounts reads, from /proc/self/mountinfo, the cgroup v1 mount point of
// every controller a group needs and the mount point of the v2 hierarchy.
// Controllers mounted together (cpu,cpuacct) share a mount point.
func FindMounts(mountinfo io.Reader) Mounts {
	mounts := Mounts{}
	wanted := append(controllers(), pidsController)
	sc := bufio.NewScanner(mountinfo)
	for sc.Scan() {
		// "36 25 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, postFields := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(postFields) < 3 {
			continue
		}
		switch postFields[0] {
		case "cgroup2":
			if _, dup := mounts[unified]; !dup {
				mounts[unified] = unescapeMountPath(fields[4])
			}
		case "cgroup":
			for _, opt := range strings.Split(postFields[2], ",") {
				if slices.Contains(wanted, opt) {
					if _, dup := mounts[opt]; !dup {
						mounts[opt] = unescapeMountPath(fields[4])
					}
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

// Hierarchy is where this host's groups are made: the v1 hierarchies of
// cpu, cpuacct and memory when all are mounted, else the v2 hierarchy.
type Hierarchy struct {
	v1     Mounts // controller -> mount point; nil when v1 is not used
	v2     string // the unified mount point; "" when v2 is not used
	logger *slog.Logger
	warn   sync.Once

	mu       sync.Mutex
	unusable error // why groups could not be made, once they could not
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

// NewHierarchyAt uses the given mounts: v1 when its three controllers are
// all there (v1 controllers are then not in the v2 hierarchy), else v2 if
// it is mounted.
func NewHierarchyAt(mounts Mounts, logger *slog.Logger) *Hierarchy {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &Hierarchy{logger: logger}
	v1 := Mounts{}
	for _, c := range controllers() {
		if dir, ok := mounts[c]; ok {
			v1[c] = dir
		}
	}
	switch {
	case len(v1) == len(controllers()):
		if dir, ok := mounts[pidsController]; ok {
			v1[pidsController] = dir
		}
		h.v1 = v1
	case mounts[unified] != "":
		h.v2 = mounts[unified]
	}
	return h
}

// Version is the cgroup version groups are made in: 1, 2, or 0 for none.
func (h *Hierarchy) Version() int {
	switch {
	case h.v1 != nil:
		return 1
	case h.v2 != "":
		return 2
	}
	return 0
}

// Group is one instance's group, dbcloud/<id>: a directory in each v1
// hierarchy, or one directory in the v2 hierarchy.
type Group struct {
	dirs   map[string]string // v1: controller -> directory
	mounts Mounts            // v1
	dir    string            // v2
	root   string            // v2: the mount point dir is under
}

// Of returns the group's paths without creating anything, or nil when
// there is no hierarchy to make groups in.
func (h *Hierarchy) Of(id string) *Group {
	switch h.Version() {
	case 1:
		g := &Group{dirs: map[string]string{}, mounts: h.v1}
		for c, mount := range h.v1 {
			g.dirs[c] = filepath.Join(mount, Parent, id)
		}
		return g
	case 2:
		return &Group{dir: filepath.Join(h.v2, Parent, id), root: h.v2}
	}
	return nil
}

// Existing returns the group when it was created, else nil.
func (h *Hierarchy) Existing(id string) *Group {
	if g := h.Of(id); g != nil && g.Exists() {
		return g
	}
	return nil
}

// Ensure creates the group and lets owner (nil: only dbcloud's user)
// write its cgroup.procs, so that on v1 a process started as owner can
// join the group itself before it runs. It returns nil, having logged once,
// when cgroups cannot be used on this host: instances then run without
// limits rather than not at all.
func (h *Hierarchy) Ensure(id string, owner *syscall.Credential) *Group {
	g := h.Of(id)
	var err error
	switch {
	case g == nil:
		err = fmt.Errorf("neither cgroup v1 (cpu, cpuacct and memory) nor cgroup v2 is mounted (found %v)", h.v1)
	case g.dir != "":
		err = h.ensureV2(g, owner)
	default:
		err = g.ensureV1(owner)
	}
	if err != nil {
		h.mu.Lock()
		h.unusable = err
		h.mu.Unlock()
		h.warn.Do(func() {
			h.logger.Warn("cgroups unusable; instances run without CPU and memory limits", "error", err)
		})
		return nil
	}
	return g
}

// Enforced says whether CPU and memory limits are enforced on this host,
// and if not, why: there is a hierarchy and no group has failed to be
// made in it.
func (h *Hierarchy) Enforced() (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.Version() == 0 {
		return false, errors.New("neither cgroup v1 (cpu, cpuacct and memory) nor cgroup v2 is mounted")
	}
	return h.unusable == nil, h.unusable
}

// SpawnDir is the v2 group directory a process can be spawned straight
// into (clone3 with CLONE_INTO_CGROUP); "" on v1, where a process joins
// its groups itself.
func (g *Group) SpawnDir() string { return g.dir }

// Dir is the group's directory in the hierarchy of controller ("cpu",
// "cpuacct" or "memory"); on v2 there is one directory for all.
func (g *Group) Dir(controller string) string {
	if g.dir != "" {
		return g.dir
	}
	return g.dirs[controller]
}

func (g *Group) uniqueDirs() []string {
	if g.dir != "" {
		return []string{g.dir}
	}
	var dirs []string
	for _, c := range append(controllers(), pidsController) {
		if dir, ok := g.dirs[c]; ok && !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
	}
	return dirs
}

// Exists reports whether the group was created (on v1, in the memory
// hierarchy, the one that matters for reading usage).
func (g *Group) Exists() bool {
	_, err := os.Stat(g.Dir("memory"))
	return err == nil
}

// ProcsFiles lists the cgroup.procs file of every hierarchy.
func (g *Group) ProcsFiles() []string {
	var files []string
	for _, dir := range g.uniqueDirs() {
		files = append(files, filepath.Join(dir, "cgroup.procs"))
	}
	return files
}

// Limits are a group's CPU quota (millicores), CPU weight (v1 shares,
// 1024 a core) and memory limit. Zero means unlimited; a zero weight
// follows the quota (a core's weight per core), or the default without
// one.
type Limits struct {
	CPUMillis   int
	CPUShares   int
	MemoryBytes int64
}

// shares is the weight to write, in v1 units.
func (l Limits) shares() int {
	switch {
	case l.CPUShares > 0:
		return min(max(2, l.CPUShares), 262144)
	case l.CPUMillis > 0:
		return max(2, l.CPUMillis*1024/1000)
	}
	return 1024
}

// burstFor is the CPU burst (µs) a group with these limits may take on
// top of its quota in one period: as much as the quota, the kernel's
// maximum, from CPU it left unused before. A quota spreads a
// short task over periods: a shared instance (half a core) that starts,
// or wakes for a client, needs about 100 ms of CPU for its startup, its
// first sessions and dbcloud's own, and without a burst sleeps through
// half of each period while doing it, which doubles a wake. Over any
// longer stretch the group still gets no more than its quota, and its
// weight still decides who runs when the host is busy. Setting the
// limits refills the budget, so a new group starts with the burst too.
func burstFor(l Limits) string {
	if l.CPUMillis <= 0 {
		return "0"
	}
	return strconv.Itoa(l.CPUMillis * cfsPeriod / 1000)
}

// withBurst runs set, which writes the quota, between clearing the burst
// file at path and setting it to burstFor(l): the kernel refuses a burst
// above the quota, and the new quota may be lower than the old one. A
// kernel before 5.14 has no such file, and no burst.
func withBurst(path string, l Limits, set func() error) error {
	if _, err := os.Stat(path); err != nil {
		return set()
	}
	if err := proc.WriteControlFile(path, "0"); err != nil {
		return err
	}
	if err := set(); err != nil {
		return err
	}
	return proc.WriteControlFile(path, burstFor(l))
}

// SetLimits applies the limits and, where the pids controller is there,
// PidsMax. They take effect immediately for running processes.
func (g *Group) SetLimits(l Limits) error {
	if g.dir != "" {
		return g.setLimitsV2(l)
	}
	return g.setLimitsV1(l)
}

// Usage reads the CPU time consumed by the group so far and its memory
// working set: usage minus inactive page cache, which the kernel reclaims
// before it would OOM-kill anything (what kubelet and cAdvisor report).
func (g *Group) Usage() (cpuNanos uint64, memoryBytes int64, err error) {
	if g.dir != "" {
		return g.usageV2()
	}
	return g.usageV1()
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
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// statValue reads one "key value" line of a stat file (memory.stat,
// cpu.stat); missing keys read as 0.
func statValue(path, key string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}

func readInt(path string) (int64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}
