package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"dbcloud/runtime/local/internal/proc"
)

// ensureV1 makes the group's directory in each v1 hierarchy and hands its
// cgroup.procs to owner, who writes its own PID there before it runs.
func (g *Group) ensureV1(owner *syscall.Credential) error {
	for _, dir := range g.uniqueDirs() {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if owner != nil {
			if err := os.Chown(filepath.Join(dir, "cgroup.procs"), int(owner.Uid), int(owner.Gid)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (g *Group) setLimitsV1(l Limits) error {
	cpu := g.dirs["cpu"]
	quota, shares := "-1", strconv.Itoa(l.shares())
	if l.CPUMillis > 0 {
		quota = strconv.Itoa(l.CPUMillis * cfsPeriod / 1000)
	}
	limit := "-1"
	if l.MemoryBytes > 0 {
		limit = strconv.FormatInt(l.MemoryBytes, 10)
	}
	err := withBurst(filepath.Join(cpu, "cpu.cfs_burst_us"), l, func() error {
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
	})
	if err != nil {
		return err
	}
	if dir, ok := g.dirs[pidsController]; ok {
		return proc.WriteControlFile(filepath.Join(dir, "pids.max"), strconv.Itoa(PidsMax))
	}
	return nil
}

func (g *Group) usageV1() (cpuNanos uint64, memoryBytes int64, err error) {
	cpu, err := readInt(filepath.Join(g.dirs["cpuacct"], "cpuacct.usage"))
	if err != nil {
		return 0, 0, err
	}
	mem := g.dirs["memory"]
	used, err := readInt(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return 0, 0, err
	}
	inactive, err := statValue(filepath.Join(mem, "memory.stat"), "total_inactive_file")
	if err != nil {
		return 0, 0, fmt.Errorf("parse memory.stat: %w", err)
	}
	return uint64(cpu), max(0, used-inactive), nil
}
