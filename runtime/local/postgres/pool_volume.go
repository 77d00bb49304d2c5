package postgres

import (
	"context"
	"os"
	"path/filepath"
)

// PoolVolumeEntry is where a pool entry that is a volume of its own
// (EntryVolumes) keeps what a plain entry holds at its top (pgdata, the
// identity file, its preparation's files): a claim renames the volume to
// a new service's directory, and the entry is then at
// <service>/claimed, as a claim into a service's existing directory puts
// it.
const PoolVolumeEntry = "claimed"

// EntryVolumes says whether pool entries are volumes of their own. Where
// every service's directory is a volume (a btrfs subvolume with a quota),
// a rename cannot cross from PoolDir into it (EXDEV), so an entry in
// PoolDir could never be taken: every create prepared its cluster inline.
// A subvolume, though, can be renamed anywhere on its filesystem: each
// entry is one, and a create's claim renames it whole to where its
// service's volume goes, whose limit is set on it then. Entries are made
// only with Identities (dbcloud runs as root), whose creates claim; the
// Prepare of an instance without a claimed cluster makes one inline.
func (m *Instances) EntryVolumes() bool { return m.volumes != nil }

// entryDir is where the pool entry named name (in PoolDir) keeps its
// cluster, identity file and preparation files.
func (m *Instances) entryDir(name string) string {
	if m.volumes != nil {
		return filepath.Join(m.PoolDir, name, PoolVolumeEntry)
	}
	return filepath.Join(m.PoolDir, name)
}

// makeEntry makes the pool entry dir (in PoolDir), a volume with
// EntryVolumes, and returns where its contents go (entryDir).
func (m *Instances) makeEntry(ctx context.Context, dir string) (string, error) {
	if m.volumes == nil {
		return dir, os.Mkdir(dir, 0o755)
	}
	// No limit while it waits: it gets its service's when claimed.
	if err := m.volumes.Create(ctx, dir, 0o755, 0); err != nil {
		return "", err
	}
	inner := filepath.Join(dir, PoolVolumeEntry)
	return inner, os.Mkdir(inner, 0o755)
}

// removeEntryDir removes a pool entry's directory, a volume or not, once
// what a preparation ran in it is stopped. A volume goes with its quota
// group (volume.Volumes.Remove).
func (m *Instances) removeEntryDir(ctx context.Context, dir string) error {
	// Both places: an entry made before entries were volumes (or after)
	// has its preparation at its top.
	for _, work := range []string{filepath.Join(dir, PoolVolumeEntry), dir} {
		if err := stopWork(work); err != nil {
			return err
		}
	}
	if m.volumes != nil {
		return m.volumes.Remove(ctx, dir)
	}
	return os.RemoveAll(dir)
}
