package cgroup

import (
	"strings"
	"testing"
)

func TestFindMounts(t *testing.T) {
	t.Run("Separate", func(t *testing.T) {
		const mountinfo = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
		got := FindMounts(strings.NewReader(mountinfo))
		want := Mounts{"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct", "memory": "/sys/fs/cgroup/memory"}
		if len(got) != len(want) {
			t.Fatalf("got %v, want %v", got, want)
		}
		for c, p := range want {
			if got[c] != p {
				t.Errorf("%s: got %q, want %q", c, got[c], p)
			}
		}
	})
	t.Run("Combined", func(t *testing.T) {
		const mountinfo = `25 24 0:22 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct
26 24 0:23 / /sys/fs/cgroup/memory rw,nosuid shared:10 - cgroup cgroup rw,memory
27 24 0:24 / /sys/fs/cgroup/my\040mem rw - cgroup cgroup rw,blkio
`
		got := FindMounts(strings.NewReader(mountinfo))
		if got["cpu"] != "/sys/fs/cgroup/cpu,cpuacct" || got["cpuacct"] != got["cpu"] || got["memory"] != "/sys/fs/cgroup/memory" {
			t.Errorf("got %v", got)
		}
		g := NewHierarchyAt(got, nil).Of("x")
		if n := len(g.uniqueDirs()); n != 2 {
			t.Errorf("combined cpu,cpuacct: got %d group dirs, want 2", n)
		}
	})
	t.Run("V2Only", func(t *testing.T) {
		got := FindMounts(strings.NewReader("30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"))
		if len(got) != 0 {
			t.Errorf("got %v, want none", got)
		}
		if g := NewHierarchyAt(got, nil).Of("x"); g != nil {
			t.Error("Of without v1 mounts: want nil")
		}
	})
	if got := unescapeMountPath(`/a\040b`); got != "/a b" {
		t.Errorf("unescape: got %q", got)
	}
}
