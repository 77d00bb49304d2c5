package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"dbcloud/runtime/local/internal/proc"
)

// ensureV2 makes the group in the unified hierarchy, with the cpu and
// memory controllers enabled for it: in the subtree_control of the root
// and of Parent (v2 hands a controller down only where each ancestor
// enables it). A hierarchy that does not offer them (a host whose cpu and
// memory are still bound to v1) cannot hold limits, so the group is not
// used. Processes are spawned straight into it, so owner needs no rights.
func (h *Hierarchy) ensureV2(g *Group, owner *syscall.Credential) error {
	for _, dir := range []string{h.v2, filepath.Join(h.v2, Parent)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		available, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if err != nil {
			return err
		}
		for _, c := range []string{"cpu", "memory"} {
			if !strings.Contains(" "+strings.TrimSpace(string(available))+" ", " "+c+" ") {
				return fmt.Errorf("cgroup v2 at %s does not offer the %s controller", dir, c)
			}
		}
		want := []string{"cpu", "memory"}
		if strings.Contains(" "+strings.TrimSpace(string(available))+" ", " "+pidsController+" ") {
			want = append(want, pidsController)
		}
		enabled, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
		for _, c := range want {
			if strings.Contains(" "+strings.TrimSpace(string(enabled))+" ", " "+c+" ") {
				continue
			}
			if err := proc.WriteControlFile(filepath.Join(dir, "cgroup.subtree_control"), "+"+c); err != nil {
				return fmt.Errorf("enable the %s controller: %w", c, err)
			}
		}
	}
	return os.MkdirAll(g.dir, 0o755)
}

// setLimitsV2 writes cpu.max ("QUOTA PERIOD", or "max PERIOD"), cpu.weight
// (v1's shares mapped onto 1..10000 as systemd and runc map them) and
// memory.max.
func (g *Group) setLimitsV2(l Limits) error {
	quota, weight := "max", strconv.Itoa(1+(l.shares()-2)*9999/262142)
	if l.CPUMillis > 0 {
		quota = strconv.Itoa(l.CPUMillis * cfsPeriod / 1000)
	}
	limit := "max"
	if l.MemoryBytes > 0 {
		limit = strconv.FormatInt(l.MemoryBytes, 10)
	}
	err := withBurst(filepath.Join(g.dir, "cpu.max.burst"), l, func() error {
		for _, w := range []struct{ file, value string }{
			{"cpu.max", quota + " " + strconv.Itoa(cfsPeriod)},
			{"cpu.weight", weight},
			{"memory.max", limit},
		} {
			if err := proc.WriteControlFile(filepath.Join(g.dir, w.file), w.value); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// pids.max exists where the parent enabled the controller.
	if _, err := os.Stat(filepath.Join(g.dir, "pids.max")); err == nil {
		return proc.WriteControlFile(filepath.Join(g.dir, "pids.max"), strconv.Itoa(PidsMax))
	}
	return nil
}

// usageV2 reads cpu.stat's usage_usec, and memory.current less the
// inactive page cache of memory.stat.
func (g *Group) usageV2() (cpuNanos uint64, memoryBytes int64, err error) {
	usec, err := statValue(filepath.Join(g.dir, "cpu.stat"), "usage_usec")
	if err != nil {
		return 0, 0, fmt.Errorf("parse cpu.stat: %w", err)
	}
	used, err := readInt(filepath.Join(g.dir, "memory.current"))
	if err != nil {
		return 0, 0, err
	}
	inactive, err := statValue(filepath.Join(g.dir, "memory.stat"), "inactive_file")
	if err != nil {
		return 0, 0, fmt.Errorf("parse memory.stat: %w", err)
	}
	return uint64(usec) * 1000, max(0, used-inactive), nil
}
