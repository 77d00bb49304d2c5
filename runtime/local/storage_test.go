package local

import (
	"testing"

	"dbcloud/runtime/local/internal/volume"
)

// Temporary files, the WAL a replication slot holds and, for small limits,
// pg_wal between checkpoints are bounded by the service's storage limit:
// none of them is data that the guard's read-only mode refuses.
func TestStorageSettings_BoundedByLimit(t *testing.T) {
	rt := &Runtime{cfg: Config{DataDir: t.TempDir()}, volumes: volume.New(volume.Filesystem{})}
	cases := []struct {
		name                    string
		limit                   int64
		temp, slot, wal, minWAL string
	}{
		// 400 MiB: 64 MiB of temporary files per process and 128 MiB of
		// WAL per slot (the floors), checkpoints every 64 MiB of WAL.
		{name: "400MiB", limit: 400 << 20, temp: "65536", slot: "128", wal: "64", minWAL: "32"},
		// 10 GiB (a shared service's default): 1 GiB, 2.5 GiB, and
		// PostgreSQL's own max_wal_size.
		{name: "10GiB", limit: 10 << 30, temp: "1048576", slot: "2560"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := rt.storageSettings("svc", c.limit, map[string]string{})
			want := map[string]string{"temp_file_limit": c.temp, "max_slot_wal_keep_size": c.slot, "max_wal_size": c.wal, "min_wal_size": c.minWAL}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}
