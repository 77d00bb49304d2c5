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

	"dbcloud/internal/tenantfs"
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
// during the walk (recycled WAL, temp files) are skipped. The data
// directory is the service user's: the walk goes through tenantfs, each
// entry stat'ed relative to its directory's descriptor (fstatat, one path
// component per file: the walk runs for every service every few minutes)
// and each directory entered without following a link, so a directory
// swapped for a link to / mid-walk makes the walk fail, not measure the
// host.
func dirSize(dir string) (int64, error) {
	d, err := tenantfs.OpenDir(dir)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	return treeSize(d)
}

func treeSize(d *tenantfs.Dir) (int64, error) {
	infos, err := d.ReadDir()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, fi := range infos {
		switch {
		case fi.Mode().IsRegular():
			total += fi.Size()
		case fi.IsDir():
			sub, err := d.OpenDir(fi.Name())
			if errors.Is(err, fs.ErrNotExist) {
				continue
			} else if err != nil {
				return 0, err
			}
			n, err := treeSize(sub)
			sub.Close()
			if err != nil {
				return 0, err
			}
			total += n
		}
	}
	return total, nil
}

// HostCapacity returns the host's CPUs (in millicores), memory and the free
// disk space of dir's filesystem (of its nearest existing ancestor if dir
// does not exist yet).
func HostCapacity(dir string) (cpuMillis int, memBytes, diskFreeBytes int64, err error) {
	cpuMillis = runtime.NumCPU() * 1000
	if memBytes, err = meminfo("MemTotal"); err != nil {
		return 0, 0, 0, fmt.Errorf("host capacity: %w", err)
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

// MemAvailable is the kernel's estimate of the memory available for new
// work without swapping.
func MemAvailable() (int64, error) { return meminfo("MemAvailable") }

// meminfo reads one field of /proc/meminfo, in bytes.
func meminfo(field string) (int64, error) {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s %q: %w", field, v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", field)
}
