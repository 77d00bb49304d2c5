package postgres

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// Usage is what an instance consumes right now.
type Usage struct {
	// CPUNanos is the CPU time used since the cgroup was created
	// (cpuacct.usage); a rate needs two samples.
	CPUNanos uint64
	// MemoryBytes is the working set: memory.usage_in_bytes minus
	// total_inactive_file.
	MemoryBytes int64
	// StorageBytes is the size of the data directory, WAL included.
	StorageBytes int64
}

// Usage reads the instance's CPU time and memory working set from its
// cgroups (zero without cgroups) and sums the file sizes in Dir/pgdata.
func (m *Instances) Usage(s Spec) (Usage, error) {
	u, err := m.CgroupUsage(s)
	if err != nil {
		return Usage{}, err
	}
	if u.StorageBytes, err = m.DataSize(s); err != nil {
		return Usage{}, err
	}
	return u, nil
}

// CgroupUsage is Usage without the storage: a few small cgroup files, where
// the data directory's size takes a stat of each of its files.
func (m *Instances) CgroupUsage(s Spec) (Usage, error) {
	var u Usage
	if cg := m.cgroups.Of(s.ID); cg != nil && cg.Exists() {
		cpu, mem, err := cg.Usage()
		if err != nil {
			return Usage{}, fmt.Errorf("usage of instance %s: %w", s.ID, err)
		}
		u.CPUNanos, u.MemoryBytes = cpu, mem
	}
	return u, nil
}

// DataSize sums the file sizes in Dir/pgdata.
func (m *Instances) DataSize(s Spec) (int64, error) {
	size, err := dirSize(s.PGData())
	if err != nil {
		return 0, fmt.Errorf("usage of instance %s: %w", s.ID, err)
	}
	return size, nil
}

// dirSize sums the sizes of the regular files under dir. Files that vanish
// during the walk (recycled WAL, temp files) are skipped.
func dirSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != dir {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total, err
}

// HostCapacity returns the host's CPUs (in millicores), memory and the free
// disk space of dir's filesystem (of its nearest existing ancestor if dir
// does not exist yet).
func HostCapacity(dir string) (cpuMillis int, memBytes, diskFreeBytes int64, err error) {
	cpuMillis = runtime.NumCPU() * 1000
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("host capacity: %w", err)
	}
	for _, line := range strings.Split(string(meminfo), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, 0, 0, fmt.Errorf("host capacity: parse MemTotal %q: %w", v, err)
			}
			memBytes = kb * 1024
		}
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("host capacity: %w", err)
	}
	var st syscall.Statfs_t
	for {
		err = syscall.Statfs(dir, &st)
		if !errors.Is(err, syscall.ENOENT) || dir == "/" {
			break
		}
		dir = filepath.Dir(dir)
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("host capacity: statfs %s: %w", dir, err)
	}
	return cpuMillis, memBytes, int64(st.Bavail) * int64(st.Bsize), nil
}
