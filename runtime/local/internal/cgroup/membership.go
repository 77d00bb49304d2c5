package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"dbcloud/runtime/local/internal/proc"
)

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

// Contains reports whether pid is in the group, in every hierarchy, from
// /proc/PID/cgroup ("4:memory:/dbcloud/x" on v1, "0::/dbcloud/x" on v2).
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
		if g.dir != "" {
			if parts[0] == "0" && parts[1] == "" && filepath.Join(g.root, parts[2]) == g.dir {
				return true
			}
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if dir, ok := g.dirs[c]; ok && filepath.Join(g.mounts[c], parts[2]) == dir {
				in[c] = true
			}
		}
	}
	return g.dir == "" && len(in) == len(g.dirs)
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

// Confine makes spec start its process inside the group: spawned straight
// into it on v2, joining it through the spawn wrapper on v1. A nil group
// leaves spec as it is.
func (g *Group) Confine(spec *proc.Spec) {
	switch {
	case g == nil:
	case g.dir != "":
		spec.CgroupDir = g.dir
	default:
		spec.JoinCgroups = g.ProcsFiles()
	}
}
