package local

import (
	"fmt"

	"dbcloud"
)

// Resources is what a size means on this host: the cgroup limits and the
// PostgreSQL settings that follow from them.
type Resources struct {
	CPUMillis   int
	MemoryBytes int64
	Settings    map[string]string
}

// sharedMemory is the memory limit of a shared service. An idle instance
// uses about 18 MB, so dozens of shared services fit on one host.
const sharedMemory = 512 << 20

// ResourcesFor derives limits and settings from a size, with the ratios of
// timescaledb-tune (runtime-notes.md section 7): shared_buffers a quarter of
// memory, effective_cache_size three quarters, connections by memory.
func ResourcesFor(size dbcloud.Size) Resources {
	if size.Shared {
		return Resources{
			CPUMillis: 500, MemoryBytes: sharedMemory,
			Settings: map[string]string{
				"shared_buffers": "16MB", "effective_cache_size": "256MB", "maintenance_work_mem": "32MB",
				"work_mem": "4MB", "max_connections": "25", "max_worker_processes": "4",
				"max_parallel_workers": "1", "max_parallel_workers_per_gather": "0",
				"max_parallel_maintenance_workers": "1", "autovacuum_max_workers": "2",
			},
		}
	}
	memMB := size.MemoryGBs * 1024
	cpus := max(1, (size.CPUMillis+999)/1000)
	conns := 100
	switch {
	case size.MemoryGBs <= 2:
		conns = 25
	case size.MemoryGBs <= 4:
		conns = 50
	case size.MemoryGBs <= 6:
		conns = 75
	}
	half := max(1, (cpus+1)/2)
	workKB := max(64, size.MemoryGBs*400*1024/conns/half)
	return Resources{
		CPUMillis: size.CPUMillis, MemoryBytes: int64(size.MemoryGBs) << 30,
		Settings: map[string]string{
			"shared_buffers":                   fmt.Sprintf("%dMB", memMB/4),
			"effective_cache_size":             fmt.Sprintf("%dMB", memMB*3/4),
			"maintenance_work_mem":             fmt.Sprintf("%dMB", min(size.MemoryGBs*128, 2047)),
			"work_mem":                         fmt.Sprintf("%dkB", workKB),
			"max_connections":                  fmt.Sprint(conns),
			"max_worker_processes":             fmt.Sprint(cpus + 8),
			"max_parallel_workers":             fmt.Sprint(cpus),
			"max_parallel_workers_per_gather":  fmt.Sprint(half),
			"max_parallel_maintenance_workers": fmt.Sprint(half),
			"autovacuum_max_workers":           "3",
		},
	}
}
