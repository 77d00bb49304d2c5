package postgres

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"dbcloud/runtime/local/internal/volume"
	"dbcloud/runtime/local/internal/volume/volumetest"
)

// TestPool_EntryVolumes: where services' directories are volumes (btrfs
// subvolumes with quotas), each pool entry is a volume of its own: a
// claim renames it whole to a new service's directory, which is then a
// volume that takes a limit, with the cluster and its identity in
// PoolVolumeEntry; a volume entry a crash left half made is removed at
// Open; and no instance takes a cluster out of an entry (the rename of
// its pgdata would cross volumes).
func TestPool_EntryVolumes(t *testing.T) {
	ctx := t.Context()
	base := volumetest.BtrfsDir(t, 1<<30)
	// PostgreSQL's OS user passes through the test's directories.
	for dir := base; dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fsys, err := volume.Probe(ctx, base)
	if err != nil || !fsys.Quotas {
		t.Fatalf("probe %s: %+v %v, want quotas", base, fsys, err)
	}
	vols := volume.New(fsys)
	m, users, claimed := newIdentityPool(t, base, "dbcv", 1, 1)
	m.volumes = vols
	if !m.EntryVolumes() {
		t.Fatal("pool entries are not volumes on btrfs with quotas")
	}
	// What a crash left: a volume entry being prepared.
	dead := filepath.Join(m.PoolDir, poolTmpPrefix+"dead")
	if err := os.MkdirAll(m.PoolDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := vols.Create(ctx, dead, 0o755, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dead, PoolVolumeEntry, "pgdata"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("half-made volume entry left after Open: %v", err)
	}
	waitPoolReady(t, m, 1)
	if entry := filepath.Join(m.PoolDir, m.readyEntries()[0]); !isVolume(t, entry) {
		t.Errorf("pool entry %s is not a volume", entry)
	}
	if taken, err := m.takeFromPool(ctx, filepath.Join(base, "inst", "pgdata")); err != nil || taken != "" {
		t.Errorf("an instance took %q (%v) out of a volume entry", taken, err)
	}

	dst := filepath.Join(base, "services", "svc")
	if err := os.MkdirAll(filepath.Dir(dst), 0o711); err != nil {
		t.Fatal(err)
	}
	key, ok, err := m.Claim(ctx, dst)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	*claimed = append(*claimed, key)
	if !isVolume(t, dst) {
		t.Errorf("claimed %s is not a volume", dst)
	}
	who, found, err := users.Lookup(key)
	if err != nil || !found {
		t.Fatalf("identity %q: %v %v", key, found, err)
	}
	fi, err := os.Stat(filepath.Join(dst, PoolVolumeEntry, "pgdata", "PG_VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != who.UID {
		t.Errorf("cluster owned by uid %d, want its identity's %d", st.Uid, who.UID)
	}
	if raw, err := os.ReadFile(filepath.Join(dst, PoolVolumeEntry, PoolIdentityFile)); err != nil || strings.TrimSpace(string(raw)) != key {
		t.Errorf("identity file %q %v, want %q", raw, err, key)
	}
	const limit = 512 << 20
	if err := vols.SetLimit(ctx, dst, limit); err != nil {
		t.Fatal(err)
	}
	if u, err := vols.Usage(ctx, dst, true); err != nil || u.Limit != limit || u.Referenced == 0 {
		t.Errorf("claimed volume's accounting %+v %v, want the cluster referenced and limit %d", u, err, limit)
	}
	if err := vols.Remove(ctx, dst); err != nil {
		t.Fatal(err)
	}
}

// isVolume says whether dir is the root of a btrfs subvolume (inode 256).
func isVolume(t *testing.T, dir string) bool {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino == 256
}
