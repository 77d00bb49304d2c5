package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"dbcloud"
	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/internal/localtest"
	"dbcloud/runtime/local/internal/volume"
	"dbcloud/runtime/local/postgres"
	"dbcloud/sizing"
	"dbcloud/tlsca"
)

// readOnlySetting is the guard's switch as the rendered postgresql.conf
// carries it.
const readOnlySetting = "dbcloud_guard.storage_read_only = 'on'"

// storageRuntime is a runtime with no OS users, pool or PostgreSQL
// running: enough for enforceStorage to write its state and render the
// primary's config (a reload of an instance that does not run only
// renders), nothing more.
func storageRuntime(t *testing.T) *Runtime {
	t.Helper()
	base := localtest.Base(t)
	ca, err := tlsca.LoadOrCreateCA(filepath.Join(base, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(base, "data")
	if err := os.MkdirAll(filepath.Join(dataDir, "services"), 0o711); err != nil {
		t.Fatal(err)
	}
	fs, err := volume.Probe(t.Context(), dataDir)
	if err != nil {
		t.Fatal(err)
	}
	logger := localtest.Logger(t)
	instances, err := postgres.NewInstances(postgres.Config{BinDir: pgbin.Dir(), PoolDir: filepath.Join(base, "pool"), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	return &Runtime{
		cfg: Config{BinDir: pgbin.Dir(), DataDir: dataDir, Host: "127.0.0.1", CA: ca, Logger: logger,
			StorageLimits: sizing.StorageLimits{SharedMiB: 100, MiBPerMemoryGiB: 100}},
		instances: instances, volumes: volume.New(fs),
		storageNear: map[string]bool{},
	}
}

// TestEnforceStorage_ReadOnly measures a service at usages that cross the
// read-only level up and down: the state file and the primary's rendered
// postgresql.conf turn the guard's storage_read_only on at 95% and keep
// it on until usage is below 93% (hysteresis), at both edges.
func TestEnforceStorage_ReadOnly(t *testing.T) {
	rt := storageRuntime(t)
	svc := &dbcloud.Service{ID: "ro1",
		Endpoint: &dbcloud.Endpoint{Host: "127.0.0.1", Port: localtest.FreePort(t)},
		Spec:     dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Running: true}}
	// The service's directory and its primary's exist, as for every
	// service measured; no cluster is in it.
	if err := rt.makeServiceVolume(t.Context(), svc, rt.serviceDir(svc.ID)); err != nil {
		t.Fatal(err)
	}
	primary := postgres.Spec{Dir: filepath.Join(rt.serviceDir(svc.ID), "0")}
	if err := os.Mkdir(primary.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	limit := rt.cfg.StorageLimits.Of(svc.Spec.Size)
	conf := primary.ConfPath("postgresql.conf")
	rendered := false // whether a change rendered the config yet
	for _, step := range []struct {
		percent  int64
		readOnly bool
	}{
		{50, false},
		{94, false}, // rising: one below the read-only level
		{95, true},  // rising edge
		{96, true},
		{94, true}, // falling: between the two levels stays read-only
		{93, true}, // the last percent that stays
		{92, false},
		{96, true},
	} {
		var obs dbcloud.Observation
		rt.enforceStorage(svc, step.percent*limit/100, &obs)
		if got := rt.storageReadOnly(svc.ID); got != step.readOnly {
			t.Errorf("at %d%%: read-only state %v, want %v", step.percent, got, step.readOnly)
		}
		settings := rt.storageSettings(svc.ID, limit, map[string]string{})
		if got := settings["dbcloud_guard.storage_read_only"] == "on"; got != step.readOnly {
			t.Errorf("at %d%%: settings %v, want storage_read_only on = %v", step.percent, settings, step.readOnly)
		}
		if step.readOnly != strings.Contains(obs.Notice, "refused until") {
			t.Errorf("at %d%%: notice %q, want read-only %v", step.percent, obs.Notice, step.readOnly)
		}
		data, err := os.ReadFile(conf)
		if os.IsNotExist(err) && !rendered {
			// Never read-only so far: nothing was rendered.
			if step.readOnly {
				t.Errorf("at %d%%: no postgresql.conf rendered, want one with %q", step.percent, readOnlySetting)
			}
			continue
		}
		if err != nil {
			t.Fatalf("at %d%%: %v", step.percent, err)
		}
		rendered = true
		if got := strings.Contains(string(data), readOnlySetting+"\n"); got != step.readOnly {
			t.Errorf("at %d%%: rendered postgresql.conf has %q: %v, want %v", step.percent, readOnlySetting, got, step.readOnly)
		}
	}
	// A restart of dbcloud reads the state: a new runtime renders the
	// service read-only still.
	again := &Runtime{cfg: rt.cfg, volumes: rt.volumes}
	if got := again.storageSettings(svc.ID, limit, map[string]string{}); got["dbcloud_guard.storage_read_only"] != "on" {
		t.Errorf("after a restart, settings %v, want storage_read_only on", got)
	}
}
