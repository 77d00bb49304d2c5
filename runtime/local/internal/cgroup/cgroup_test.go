package cgroup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"dbcloud/runtime/local/internal/proc"
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
		want := Mounts{"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct", "memory": "/sys/fs/cgroup/memory",
			unified: "/sys/fs/cgroup/unified"}
		if len(got) != len(want) {
			t.Fatalf("got %v, want %v", got, want)
		}
		for c, p := range want {
			if got[c] != p {
				t.Errorf("%s: got %q, want %q", c, got[c], p)
			}
		}
		// The v1 controllers are all there, so v1 is used (on such a host
		// cpu and memory cannot be in the v2 hierarchy too).
		if v := NewHierarchyAt(got, nil).Version(); v != 1 {
			t.Errorf("version = %d, want 1", v)
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
		h := NewHierarchyAt(got, nil)
		if h.Version() != 2 {
			t.Fatalf("version = %d, want 2", h.Version())
		}
		g := h.Of("x")
		if g == nil || g.SpawnDir() != "/sys/fs/cgroup/dbcloud/x" || len(g.ProcsFiles()) != 1 {
			t.Errorf("v2 group: %+v, want one directory /sys/fs/cgroup/dbcloud/x", g)
		}
	})
	t.Run("None", func(t *testing.T) {
		h := NewHierarchyAt(FindMounts(strings.NewReader("")), nil)
		if h.Version() != 0 || h.Of("x") != nil || h.Ensure("x", nil) != nil {
			t.Error("no hierarchy: want version 0 and no groups")
		}
	})
	if got := unescapeMountPath(`/a\040b`); got != "/a b" {
		t.Errorf("unescape: got %q", got)
	}
}

// fakeV2 lays out the files the kernel would show in a v2 hierarchy that
// offers cpu and memory, with group x already made (the kernel fills a new
// directory with its files; a plain directory does not).
func fakeV2(t *testing.T) (root string, g *Group) {
	t.Helper()
	root = t.TempDir()
	for _, dir := range []string{root, filepath.Join(root, Parent), filepath.Join(root, Parent, "x")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n", "cgroup.subtree_control": ""} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, content := range map[string]string{
		"cpu.max": "max 100000\n", "cpu.max.burst": "0\n", "cpu.weight": "100\n", "memory.max": "max\n", "pids.max": "max\n", "cgroup.procs": "",
		"cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
		"memory.current": "104857600\n",
		"memory.stat":    "anon 1000\nfile 60000000\nactive_file 20000000\ninactive_file 41943040\n",
	} {
		if err := os.WriteFile(filepath.Join(root, Parent, "x", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := NewHierarchyAt(Mounts{unified: root}, nil)
	if g = h.Ensure("x", nil); g == nil {
		t.Fatal("Ensure on a v2 hierarchy offering cpu and memory: nil group")
	}
	return root, g
}

// On v2 the limits are cpu.max, cpu.weight and memory.max, and usage comes
// from cpu.stat and memory.current less inactive_file: checked on the
// files the kernel would show, since this host's kernel binds cpu and
// memory to v1.
func TestGroup_V2Files(t *testing.T) {
	root, g := fakeV2(t)
	if got, _ := os.ReadFile(filepath.Join(root, Parent, "cgroup.subtree_control")); !strings.Contains(string(got), "+") {
		t.Errorf("Parent's subtree_control = %q, want the controllers enabled", got)
	}
	if err := g.SetLimits(Limits{CPUMillis: 500, MemoryBytes: 512 << 20}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, Parent, "cgroup.subtree_control")); !strings.Contains(string(got), "+pids") {
		t.Errorf("Parent's subtree_control = %q, want pids enabled", got)
	}
	for name, want := range map[string]string{"cpu.max": "50000 100000", "cpu.max.burst": "50000", "cpu.weight": "20", "memory.max": "536870912",
		"pids.max": strconv.Itoa(PidsMax)} {
		if got, _ := os.ReadFile(filepath.Join(g.SpawnDir(), name)); !strings.HasPrefix(string(got), want) {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if err := g.SetLimits(Limits{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(g.SpawnDir(), "cpu.max")); !strings.HasPrefix(string(got), "max 100000") {
		t.Errorf("unlimited cpu.max = %q, want max 100000", got)
	}
	cpu, mem, err := g.Usage()
	if err != nil || cpu != 2_500_000_000 || mem != 104857600-41943040 {
		t.Errorf("usage = %d ns, %d bytes, %v; want 2500000000 ns, %d bytes", cpu, mem, err, 104857600-41943040)
	}
}

// A v2 hierarchy that does not offer cpu and memory (this host's: they are
// bound to v1) cannot hold limits, so no group is used: Ensure says so
// rather than pretend.
func TestHierarchy_V2WithoutControllers(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("hugetlb\n"), 0o644)
	if g := NewHierarchyAt(Mounts{unified: root}, nil).Ensure("x", nil); g != nil {
		t.Errorf("Ensure without cpu and memory controllers: got a group, want nil")
	}
}

// A process spawned with a v2 group's directory runs in that group from
// its start, with no wrapper: shown on a real cgroup2 mount made for the
// test (this host boots with v1, where cgroup2 can still be mounted, with
// no cpu or memory controller in it).
func TestSpawnIntoV2Group(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting cgroup2 needs root")
	}
	root := t.TempDir()
	if err := syscall.Mount("none", root, "cgroup2", 0, ""); err != nil {
		t.Fatalf("mount cgroup2 at %s: %v (this kernel should allow it)", root, err)
	}
	t.Cleanup(func() { syscall.Unmount(root, syscall.MNT_DETACH) })
	h := NewHierarchyAt(Mounts{unified: root}, nil)
	g := h.Of("spawn-test")
	if err := os.MkdirAll(g.SpawnDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Remove(time.Now().Add(10 * time.Second)) })
	sup := proc.NewSupervisor()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := sup.Spawn(proc.Spec{Path: sleep, Args: []string{"60"}, Dir: "/", CgroupDir: g.SpawnDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(c.PID, syscall.SIGKILL)
		<-c.Exited()
	})
	if !g.Contains(c.PID) {
		raw, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c.PID), "cgroup"))
		t.Fatalf("spawned process not in %s; /proc/PID/cgroup:\n%s", g.SpawnDir(), raw)
	}
	procs, err := g.Procs()
	if err != nil || len(procs) != 1 || procs[0] != c.PID {
		t.Errorf("group procs = %v, %v; want [%d]", procs, err, c.PID)
	}
}

// On v1 a group may burst by one period's quota (burstFor), and the kernel
// takes every change of size: it refuses a burst above the quota, so a
// smaller size after a larger one must clear the burst before it lowers
// the quota.
func TestCPUBurst_V1(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making cgroups needs root")
	}
	h := NewHierarchy(nil)
	if h.Version() != 1 {
		t.Skip("needs cgroup v1")
	}
	id := "burst-test-" + strconv.Itoa(os.Getpid())
	g := h.Ensure(id, nil)
	if g == nil {
		t.Fatal("Ensure: no group")
	}
	t.Cleanup(func() { g.Remove(time.Now().Add(10 * time.Second)) })
	burst := filepath.Join(g.dirs["cpu"], "cpu.cfs_burst_us")
	if _, err := os.Stat(burst); err != nil {
		t.Skip("kernel without cpu.cfs_burst_us (before 5.14)")
	}
	for _, c := range []struct {
		millis int
		want   string
	}{{2000, "200000"}, {500, "50000"}, {0, "0"}, {250, "25000"}} {
		if err := g.SetLimits(Limits{CPUMillis: c.millis}); err != nil {
			t.Fatalf("SetLimits(%d millicores): %v", c.millis, err)
		}
		if got, _ := os.ReadFile(burst); strings.TrimSpace(string(got)) != c.want {
			t.Errorf("at %d millicores cpu.cfs_burst_us = %q, want %s", c.millis, got, c.want)
		}
	}
}

// On v1 the pids controller, mounted on its own, caps each group's
// processes: a shell in a group trying to fork more than the limit allows
// is refused, the way a tenant's fork bomb through COPY ... PROGRAM would
// be. The group's limit is PidsMax; the test lowers it to show the kernel
// enforcing it without forking hundreds of processes.
func TestPidsLimit_V1(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making cgroups needs root")
	}
	h := NewHierarchy(nil)
	if h.Version() != 1 || h.v1[pidsController] == "" {
		t.Skip("needs cgroup v1 with the pids controller mounted")
	}
	id := "pids-test-" + strconv.Itoa(os.Getpid())
	g := h.Ensure(id, nil)
	if g == nil {
		t.Fatal("Ensure: no group")
	}
	t.Cleanup(func() { g.Remove(time.Now().Add(10 * time.Second)) })
	if err := g.SetLimits(Limits{}); err != nil {
		t.Fatal(err)
	}
	pidsDir := g.dirs[pidsController]
	if got, _ := os.ReadFile(filepath.Join(pidsDir, "pids.max")); strings.TrimSpace(string(got)) != strconv.Itoa(PidsMax) {
		t.Fatalf("pids.max = %q, want %d", got, PidsMax)
	}
	if err := proc.WriteControlFile(filepath.Join(pidsDir, "pids.max"), "8"); err != nil {
		t.Fatal(err)
	}
	// 20 sleeps in the background: the shell and 7 of them fit.
	spec := proc.Spec{Path: "/bin/sh", Args: []string{"-c", `for i in $(seq 20); do sleep 30 & done; echo started; wait`},
		Dir: "/", LogPath: filepath.Join(t.TempDir(), "out")}
	g.Confine(&spec)
	c, _, err := proc.NewSupervisor().Spawn(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pids, _ := g.Procs()
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		<-c.Exited()
	})
	var out []byte
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		out, _ = os.ReadFile(spec.LogPath)
		if strings.Contains(strings.ToLower(string(out)), "fork") || strings.Contains(string(out), "started") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shell neither forked 20 times nor was refused; output:\n%s", out)
		}
	}
	if !strings.Contains(strings.ToLower(string(out)), "fork") {
		t.Errorf("no fork was refused in a group limited to 8 processes; output:\n%s", out)
	}
	if pids, err := g.Procs(); err != nil || len(pids) > 8 || len(pids) < 1 {
		t.Errorf("group holds %d processes (%v), want some sleeps, at most 8", len(pids), err)
	}
}

// TestLimits_Shares: a weight given is the weight written (bounded as the
// kernel bounds it); without one it follows the quota, a core's 1024 per
// core, and without either it is the kernel's default.
func TestLimits_Shares(t *testing.T) {
	for _, c := range []struct {
		l    Limits
		want int
	}{
		{Limits{CPUMillis: 500, CPUShares: 32}, 32},
		{Limits{CPUMillis: 500}, 512},
		{Limits{CPUMillis: 2000}, 2048},
		{Limits{}, 1024},
		{Limits{CPUShares: 1}, 2},
		{Limits{CPUShares: 1 << 20}, 262144},
	} {
		if got := c.l.shares(); got != c.want {
			t.Errorf("%+v: shares %d, want %d", c.l, got, c.want)
		}
	}
}
