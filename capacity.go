package dbcloud

// ResourceQuota bounds the compute and storage one project may reserve
// (issue 14): every instance counts, primary, HA standbys and read replica
// nodes alike. Zero means no limit.
type ResourceQuota struct {
	Instances  int `json:"instances"`
	CPUMillis  int `json:"cpu_millis"`
	MemoryGBs  int `json:"memory_gbs"`
	StorageGBs int `json:"storage_gbs"`
}

// DefaultResourceQuota is the quota of a project without its own.
var DefaultResourceQuota = ResourceQuota{Instances: 40, CPUMillis: 64000, MemoryGBs: 256, StorageGBs: 1000}

// HostCapacity is what the host can give to service instances, as the
// runtime measures it.
type HostCapacity struct {
	// CPUMillis and MemoryBytes are the host's: no single instance may be
	// larger.
	CPUMillis   int
	MemoryBytes int64
	// MemAvailableBytes is the memory available for new work now (the
	// kernel's MemAvailable); 0 when not measured.
	MemAvailableBytes int64
	// Overcommit is how many times the host's CPU and memory the running
	// dedicated instances may reserve together. Shared instances are
	// admitted by their footprint against the memory left (issue 38).
	Overcommit float64
	// DiskFreeBytes is the free space where instances keep their data.
	DiskFreeBytes int64
	// DiskReserveBytes is the part of DiskFreeBytes that no service is
	// promised: what the host keeps for dbcloud's store and itself, or,
	// on a storage image, what btrfs needs to stay usable when full.
	DiskReserveBytes int64
	// StorageLimit is what a service of a size may keep on disk, in
	// bytes; nil when the runtime does not bound storage by size.
	StorageLimit func(Size) int64
}

// Limits are what all running instances may reserve together.
func (h *HostCapacity) Limits() (cpuMillis int, memoryMB int64) {
	return int(float64(h.CPUMillis) * h.Overcommit), int64(float64(h.MemoryBytes>>20) * h.Overcommit)
}
