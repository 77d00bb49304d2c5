// Package sizing is what a size means for PostgreSQL: the CPU and memory
// an instance of it gets, the settings that follow from them and from the
// service's addons, and the storage it may keep. It is pure (values in,
// values out), so both runtimes and the service layer's admission read
// one definition.
package sizing

import (
	"fmt"
	"maps"
	"strconv"

	"dbcloud"
)

// Resources is what a size means for one instance: its CPU and memory
// limits (cgroups on the host, requests and limits of a pod) and the
// PostgreSQL settings that follow from them.
type Resources struct {
	CPUMillis int
	// CPUShares is the CPU weight under contention, in cgroup v1's
	// cpu.shares units (1024 a core).
	CPUShares   int
	MemoryBytes int64
	Settings    map[string]string
}

// The shared slice: what one shared service gets, and what it costs the
// host (issue 38). Shared services are the many small databases (a branch,
// a customer or a developer each) that sit idle most of the time: an idle
// one uses 9-18 MB, so they are not admitted by what their limits would
// reserve, as dedicated sizes are, but by a footprint, against the memory
// the host has left after the dedicated sizes and a reserve.
const (
	// SharedCPUMillis caps one shared instance at half a core: one busy
	// tenant cannot take a whole core of a small host.
	SharedCPUMillis = 500
	// SharedCPUShares is its weight under contention: a sixteenth of a
	// dedicated half core (512), so busy shared tenants yield to
	// dedicated sizes, which keep the CPU their size promises, and only
	// slow each other.
	SharedCPUShares = 32
	// SharedMemoryBytes is its hard memory limit: a memory-hungry query
	// is refused or ends its own backend, not the host's other tenants.
	SharedMemoryBytes = 512 << 20
	// SharedFootprintBytes is what admission counts for one running
	// shared instance: its idle working set (about 18 MB) with room for
	// its 16 MB of shared buffers filling and a few sessions.
	SharedFootprintBytes = 64 << 20
)

// Autovacuum's naptime by size. Every naptime the launcher of an instance
// starts a worker for each of its databases in turn (postgres, tsdb and
// template1: one every 20 s at PostgreSQL's default of 1min); on an idle
// service that worker finds nothing to vacuum, yet it costs a fork, a
// connection to its database and a read of that database's statistics,
// and at hundreds of idle services these wakeups were most of the host's
// idle CPU. A small service's tables are small, so a longer pause before
// autovacuum looks again costs little; autovacuum still runs and still
// keeps tables vacuumed, analyzed and frozen, only looking less often:
// the wraparound limit (autovacuum_freeze_max_age, 200 million
// transactions) is hours away even at the shared slice's half a core
// writing flat out, far more than 5 minutes. From 4 GB up a size keeps
// PostgreSQL's default: those services are few and busy.
const (
	SharedNaptime  = "5min"
	SmallNaptime   = "2min"
	DefaultNaptime = "1min"
)

// naptime is the autovacuum_naptime of a dedicated size of memGBs.
func naptime(memGBs int) string {
	if memGBs <= 2 {
		return SmallNaptime
	}
	return DefaultNaptime
}

// SystemReserveBytes is the memory of a host of memBytes that no service
// is promised: dbcloud itself, its store, the pool of prepared clusters,
// the page cache the instances' I/O needs, and the system. 1 GiB, or a
// sixteenth of a larger host.
func SystemReserveBytes(memBytes int64) int64 { return max(1<<30, memBytes/16) }

// For derives limits and settings from a size, with the ratios of
// timescaledb-tune (runtime-notes.md section 7): shared_buffers a quarter of
// memory, effective_cache_size three quarters, connections by memory.
func For(size dbcloud.Size) Resources {
	if size.Shared {
		return Resources{
			CPUMillis: SharedCPUMillis, CPUShares: SharedCPUShares, MemoryBytes: SharedMemoryBytes,
			Settings: map[string]string{
				"shared_buffers": "16MB", "effective_cache_size": "256MB", "maintenance_work_mem": "32MB",
				"work_mem": "4MB", "max_connections": "25", "max_worker_processes": "4",
				"max_parallel_workers": "1", "max_parallel_workers_per_gather": "0",
				"max_parallel_maintenance_workers": "1", "autovacuum_max_workers": "2",
				"autovacuum_naptime": SharedNaptime,
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
		CPUMillis: size.CPUMillis, CPUShares: max(2, size.CPUMillis*1024/1000), MemoryBytes: int64(size.MemoryGBs) << 30,
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
			"autovacuum_naptime":               naptime(size.MemoryGBs),
		},
	}
}

// WithAddons returns a size's settings (res.Settings, not changed) with
// what the service's addons need. The time-series addon's TimescaleDB only
// works preloaded, so only such services pay for its library and
// background workers: timescaledb.max_background_workers (its scheduler for
// each database plus the jobs they run, such as retention) grows with the
// CPUs, from 4 to timescaledb-tune's 16, and max_worker_processes is raised
// by those plus its launcher (runtime-notes.md section 7), so parallel
// queries keep the workers they had. Telemetry is compiled out of the
// build (scripts/extensions.sh); timescaledb.telemetry_level is still set
// off, so a build with telemetry would not phone out either, and SHOW
// answers what users of the original expect. pgvector (the ai addon)
// needs no setting.
func WithAddons(res Resources, addons []dbcloud.Addon) map[string]string {
	settings := maps.Clone(res.Settings)
	if settings == nil {
		settings = map[string]string{}
	}
	for _, a := range addons {
		if a != dbcloud.AddonTimeSeries {
			continue
		}
		cpus := max(1, (res.CPUMillis+999)/1000)
		bgWorkers := min(16, max(4, 4*cpus))
		workers, _ := strconv.Atoi(settings["max_worker_processes"])
		if workers <= 0 {
			workers = 8 // PostgreSQL's default
		}
		settings["shared_preload_libraries"] = "timescaledb"
		settings["timescaledb.max_background_workers"] = strconv.Itoa(bgWorkers)
		settings["max_worker_processes"] = strconv.Itoa(workers + bgWorkers + 1)
		settings["timescaledb.telemetry_level"] = "off"
	}
	return settings
}

// PreloadSettings are the settings a hot standby takes from its primary
// as they are: the WAL it replays was written by a server with those
// libraries, and a library such as TimescaleDB only answers queries when
// preloaded.
func PreloadSettings() []string {
	return []string{"shared_preload_libraries", "timescaledb.max_background_workers", "timescaledb.telemetry_level"}
}

// StorageLimits size what a service may keep on disk, data, WAL archive
// and snapshots together: a shared service SharedMiB, a dedicated one
// MiBPerMemoryGiB for each GiB of its memory.
type StorageLimits struct {
	SharedMiB       int64
	MiBPerMemoryGiB int64
}

// DefaultStorageLimits: 10 GiB shared; 25 GiB of disk per GiB of memory,
// so 500/2 keeps 50 GiB and 32000/128 keeps 3,200 GiB.
var DefaultStorageLimits = StorageLimits{SharedMiB: 10 << 10, MiBPerMemoryGiB: 25 << 10}

// Of is how many bytes a service of this size may keep.
func (l StorageLimits) Of(size dbcloud.Size) int64 {
	if size.Shared || size.MemoryGBs <= 0 {
		return l.SharedMiB << 20
	}
	return int64(size.MemoryGBs) * l.MiBPerMemoryGiB << 20
}
