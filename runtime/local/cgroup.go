package local

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupParent is the group under which every instance gets its own group,
// at the root of each hierarchy rather than under dbcloud's own group: a
// restart of dbcloud (for example by systemd, which kills its unit's whole
// group) must not take the instances with it.
const cgroupParent = "dbcloud"

// cgroupControllers are the cgroup v1 controllers an instance joins: cpu
// for the quota, cpuacct for CPU usage, memory for the limit and the
// working set. On the target hosts each is mounted on its own.
var cgroupControllers = []string{"cpu", "cpuacct", "memory"}

// cfsPeriod is the CPU bandwidth period; a quota of cpu_millis*100 µs per
// 100 ms gives cpu_millis/1000 CPUs.
const cfsPeriod = 100000

// cgroupMounts maps a controller to the mount point of its hierarchy.
type cgroupMounts map[string]string

// findCgroupMounts reads the cgroup v1 mount point of every controller in
// cgroupControllers from /proc/self/mountinfo. Controllers mounted
// together (cpu,cpuacct) share a mount point. A controller missing from the
// result is not mounted as cgroup v1 (cgroup v2-only hosts are not handled:
// instances then run without limits).
func findCgroupMounts(mountinfo io.Reader) cgroupMounts {
	mounts := cgroupMounts{}
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
			if slices.Contains(cgroupControllers, opt) {
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

// instanceCgroup is one instance's group, dbcloud/<ID>, in each hierarchy.
type instanceCgroup struct {
	dirs map[string]string // controller -> directory
}

// cgroupOf returns the instance's group paths without creating anything,
// or nil when the controllers are not all mounted.
func (m *Manager) cgroupOf(id string) *instanceCgroup {
	if len(m.cgroupMounts) != len(cgroupControllers) {
		return nil
	}
	cg := &instanceCgroup{dirs: map[string]string{}}
	for _, c := range cgroupControllers {
		cg.dirs[c] = filepath.Join(m.cgroupMounts[c], cgroupParent, id)
	}
	return cg
}

// ensureCgroup creates the instance's group in every hierarchy and lets the
// PostgreSQL OS user write its cgroup.procs (the start wrapper joins the
// group as that user, before postgres runs). It returns nil, having logged
// once, when cgroups cannot be used on this host: instances then run
// without limits rather than not at all.
func (m *Manager) ensureCgroup(id string) *instanceCgroup {
	cg := m.cgroupOf(id)
	if cg == nil {
		m.cgroupWarn.Do(func() {
			m.Logger.Warn("cgroup v1 cpu, cpuacct and memory controllers not all mounted; instances run without CPU and memory limits",
				"found", fmt.Sprint(m.cgroupMounts))
		})
		return nil
	}
	for _, dir := range cg.uniqueDirs() {
		err := os.MkdirAll(dir, 0o755)
		if err == nil && m.cred != nil {
			err = os.Chown(filepath.Join(dir, "cgroup.procs"), int(m.cred.Uid), int(m.cred.Gid))
		}
		if err != nil {
			m.cgroupWarn.Do(func() {
				m.Logger.Warn("cgroups not writable; instances run without CPU and memory limits", "error", err)
			})
			return nil
		}
	}
	return cg
}

// exists reports whether the group was created (in the memory hierarchy,
// the one that matters for reading usage).
func (cg *instanceCgroup) exists() bool {
	_, err := os.Stat(cg.dirs["memory"])
	return err == nil
}

func (cg *instanceCgroup) uniqueDirs() []string {
	var dirs []string
	for _, c := range cgroupControllers {
		if !slices.Contains(dirs, cg.dirs[c]) {
			dirs = append(dirs, cg.dirs[c])
		}
	}
	return dirs
}

// procsFiles lists the cgroup.procs file of every hierarchy.
func (cg *instanceCgroup) procsFiles() []string {
	var files []string
	for _, dir := range cg.uniqueDirs() {
		files = append(files, filepath.Join(dir, "cgroup.procs"))
	}
	return files
}

// add moves a process (all its threads) into the group. Its later children
// are born inside; children it already has are not moved.
func (cg *instanceCgroup) add(pid int) error {
	for _, f := range cg.procsFiles() {
		if err := writeControlFile(f, strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// contains reports whether pid is in the group of every hierarchy, from
// /proc/PID/cgroup ("4:memory:/dbcloud/x").
func (cg *instanceCgroup) contains(pid int, mounts cgroupMounts) bool {
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
			if dir, ok := cg.dirs[c]; ok && filepath.Join(mounts[c], parts[2]) == dir {
				in[c] = true
			}
		}
	}
	return len(in) == len(cg.dirs)
}

// procs returns the live processes in the group, in any hierarchy. Zombies
// are left out: they hold no resources and cannot be killed again.
func (cg *instanceCgroup) procs() ([]int, error) {
	var pids []int
	for _, f := range cg.procsFiles() {
		data, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, field := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(field)
			if err == nil && !slices.Contains(pids, pid) && processAlive(pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}

// setLimits applies a CPU quota and a memory limit; zero means unlimited.
// Both take effect immediately for running processes.
func (cg *instanceCgroup) setLimits(cpuMillis int, memoryBytes int64) error {
	cpu := cg.dirs["cpu"]
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
		{filepath.Join(cg.dirs["memory"], "memory.limit_in_bytes"), limit},
	} {
		if err := writeControlFile(w.file, w.value); err != nil {
			return err
		}
	}
	return nil
}

// usage reads the CPU time consumed by the group so far and its memory
// working set: usage minus inactive page cache, which the kernel reclaims
// before it would OOM-kill anything (what kubelet and cAdvisor report).
func (cg *instanceCgroup) usage() (cpuNanos uint64, memoryBytes int64, err error) {
	raw, err := os.ReadFile(filepath.Join(cg.dirs["cpuacct"], "cpuacct.usage"))
	if err != nil {
		return 0, 0, err
	}
	if cpuNanos, err = strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("parse cpuacct.usage: %w", err)
	}
	mem := cg.dirs["memory"]
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

// remove deletes the group from every hierarchy. The group must be empty;
// a group whose last process just exited can report EBUSY for a moment.
func (cg *instanceCgroup) remove(deadline time.Time) error {
	for _, dir := range cg.uniqueDirs() {
		for {
			err := syscall.Rmdir(dir)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("remove cgroup %s: %w", dir, err)
			}
			time.Sleep(pollInterval)
		}
	}
	return nil
}

// writeControlFile writes one value to a kernel control file (cgroupfs,
// /proc/PID/oom_score_adj). They exist already and take one value per
// write, so no truncation or temp file.
func writeControlFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(value); err != nil {
		f.Close()
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return f.Close()
}
