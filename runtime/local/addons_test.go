package local

import (
	"strings"
	"testing"

	"dbcloud/runtime/local/postgres"
	"dbcloud/sizing"

	"dbcloud"
)

func TestAddonSettings(t *testing.T) {
	size := func(cpu, mem int) dbcloud.Size { return dbcloud.Size{CPUMillis: cpu, MemoryGBs: mem} }
	for _, tc := range []struct {
		name      string
		size      dbcloud.Size
		addons    []dbcloud.Addon
		preload   bool
		bgWorkers string
		workers   string
	}{
		{"postgres", size(1000, 4), nil, false, "", "9"},
		{"vector", size(1000, 4), []dbcloud.Addon{dbcloud.AddonAI}, false, "", "9"},
		// 1 CPU: 4 background workers plus the launcher on top of 1+8.
		{"timeseries small", size(1000, 4), []dbcloud.Addon{dbcloud.AddonTimeSeries}, true, "4", "14"},
		{"timeseries 2 cpu", size(2000, 8), []dbcloud.Addon{dbcloud.AddonTimeSeries}, true, "8", "19"},
		// Capped at timescaledb-tune's 16.
		{"timeseries 8 cpu", size(8000, 32), []dbcloud.Addon{dbcloud.AddonTimeSeries, dbcloud.AddonAI}, true, "16", "33"},
		{"timeseries shared", dbcloud.Size{Shared: true}, []dbcloud.Addon{dbcloud.AddonTimeSeries}, true, "4", "9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := sizing.For(tc.size)
			before := res.Settings["max_worker_processes"]
			got := sizing.WithAddons(res, tc.addons)
			if res.Settings["max_worker_processes"] != before {
				t.Fatal("addonSettings changed the size's own settings map")
			}
			if _, has := got["shared_preload_libraries"]; has != tc.preload {
				t.Errorf("shared_preload_libraries set = %v, want %v (%q)", has, tc.preload, got["shared_preload_libraries"])
			}
			if tc.preload {
				if got["shared_preload_libraries"] != "timescaledb" || got["timescaledb.telemetry_level"] != "off" {
					t.Errorf("preload %q, telemetry %q", got["shared_preload_libraries"], got["timescaledb.telemetry_level"])
				}
			}
			if got["timescaledb.max_background_workers"] != tc.bgWorkers || got["max_worker_processes"] != tc.workers {
				t.Errorf("max_background_workers %q, max_worker_processes %q; want %q, %q",
					got["timescaledb.max_background_workers"], got["max_worker_processes"], tc.bgWorkers, tc.workers)
			}
			conf, _, _ := postgres.RenderConfig(postgres.Spec{ID: "s-0", Dir: "/x", Port: 1, Settings: got}, "root")
			if strings.Contains(conf, "timescaledb") != tc.preload {
				t.Errorf("rendered config mentions timescaledb = %v, want %v:\n%s", !tc.preload, tc.preload, conf)
			}
		})
	}
}
