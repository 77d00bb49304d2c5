package local

import (
	"testing"

	"dbcloud"
)

func TestResourcesFor(t *testing.T) {
	for _, tc := range []struct {
		size                                  dbcloud.Size
		cpu                                   int
		mem                                   int64
		sharedBuffers, maxConns, workMem, mwp string
	}{
		{dbcloud.SharedSize, 500, 512 << 20, "16MB", "25", "4MB", "4"},
		{dbcloud.Size{CPUMillis: 500, MemoryGBs: 2}, 500, 2 << 30, "512MB", "25", "32768kB", "9"},
		{dbcloud.Size{CPUMillis: 1000, MemoryGBs: 4}, 1000, 4 << 30, "1024MB", "50", "32768kB", "9"},
		{dbcloud.Size{CPUMillis: 2000, MemoryGBs: 8}, 2000, 8 << 30, "2048MB", "100", "32768kB", "10"},
		{dbcloud.Size{CPUMillis: 32000, MemoryGBs: 128}, 32000, 128 << 30, "32768MB", "100", "32768kB", "40"},
	} {
		r := ResourcesFor(tc.size)
		s := r.Settings
		if r.CPUMillis != tc.cpu || r.MemoryBytes != tc.mem || s["shared_buffers"] != tc.sharedBuffers ||
			s["max_connections"] != tc.maxConns || s["work_mem"] != tc.workMem || s["max_worker_processes"] != tc.mwp {
			t.Errorf("ResourcesFor(%v) = %d %d %v", tc.size, r.CPUMillis, r.MemoryBytes, s)
		}
	}
}
