package sizing

import (
	"testing"

	"dbcloud"
)

func TestFor(t *testing.T) {
	for _, tc := range []struct {
		size                                  dbcloud.Size
		cpu                                   int
		mem                                   int64
		sharedBuffers, maxConns, workMem, mwp string
		naptime                               string
	}{
		{dbcloud.SharedSize, 500, 512 << 20, "16MB", "25", "4MB", "4", "5min"},
		{dbcloud.Size{CPUMillis: 500, MemoryGBs: 2}, 500, 2 << 30, "512MB", "25", "32768kB", "9", "2min"},
		{dbcloud.Size{CPUMillis: 1000, MemoryGBs: 4}, 1000, 4 << 30, "1024MB", "50", "32768kB", "9", "1min"},
		{dbcloud.Size{CPUMillis: 2000, MemoryGBs: 8}, 2000, 8 << 30, "2048MB", "100", "32768kB", "10", "1min"},
		{dbcloud.Size{CPUMillis: 32000, MemoryGBs: 128}, 32000, 128 << 30, "32768MB", "100", "32768kB", "40", "1min"},
	} {
		r := For(tc.size)
		s := r.Settings
		if r.CPUMillis != tc.cpu || r.MemoryBytes != tc.mem || s["shared_buffers"] != tc.sharedBuffers ||
			s["max_connections"] != tc.maxConns || s["work_mem"] != tc.workMem || s["max_worker_processes"] != tc.mwp ||
			s["autovacuum_naptime"] != tc.naptime {
			t.Errorf("For(%v) = %d %d %v", tc.size, r.CPUMillis, r.MemoryBytes, s)
		}
	}
}

func TestStorageLimit(t *testing.T) {
	for _, c := range []struct {
		size dbcloud.Size
		gib  int64
	}{
		{dbcloud.SharedSize, 10},
		{dbcloud.Size{CPUMillis: 500, MemoryGBs: 2}, 50},
		{dbcloud.Size{CPUMillis: 32000, MemoryGBs: 128}, 3200},
	} {
		if got := DefaultStorageLimits.Of(c.size); got != c.gib<<30 {
			t.Errorf("limit of %v = %d GiB, want %d", c.size, got>>30, c.gib)
		}
	}
}
