package postgres

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"dbcloud/runtime/local/internal/treecopy"
	"dbcloud/runtime/local/internal/volume"
)

// defaultTemplateFanOut is how many pool entries clone one copy of the
// template before the next ones clone a fresh copy, where services'
// directories are btrfs subvolumes with quota groups. There, every change
// to the references of an extent (a clone of it, or a write that copies
// it) makes the kernel find every subvolume that references the extent,
// at a cost that grows with their number: with every service cloned from
// one template, making the Nth entry and the Nth service's first snapshot
// cost O(N). Measured on a 2-core machine (1,200 files of 32 KiB cloned
// into a subvolume per entry, then a syncfs): the entry's clones and
// commit took 0.52 s with 50 entries sharing the files, 2.66 s with 300;
// with a byte copy of the source every 32 entries, 0.15 to 0.42 s at any
// count. A copy costs the template's size (about 40 MB, without WAL) per
// fan-out of services: 1.3 MB each at 32.
const defaultTemplateFanOut = 32

// templateCopyPrefix names the copies of a template, inside its directory:
// a template of other inputs goes with its copies, and cleanPool removes
// the current one's, which nothing clones after a restart.
const templateCopyPrefix = "copy-"

// templateCopy is one byte copy of the template that pool entries clone.
type templateCopy struct {
	dir    string // holds pgdata
	clones int    // entries that took it, done or under way
	active int    // entries cloning it now
}

// cloneSource returns the directory whose pgdata a new pool entry clones,
// and release, to call once the entry's copy is made: the template itself
// where services' directories are not volumes (no quota groups to account
// shared extents), else the current copy of it, a new one once
// templateFanOut entries took the last.
func (m *Instances) cloneSource(ctx context.Context, tpl string, nice int) (dir string, release func(), err error) {
	if m.volumes == nil {
		return tpl, func() {}, nil
	}
	fanOut := m.templateFanOut
	if fanOut <= 0 {
		fanOut = defaultTemplateFanOut
	}
	m.copyMu.Lock()
	defer m.copyMu.Unlock()
	cur := m.copy
	if cur == nil || cur.clones >= fanOut || filepath.Dir(cur.dir) != tpl {
		dir, err := m.copyTemplate(ctx, tpl, nice)
		if err != nil {
			return "", nil, err
		}
		old := cur
		cur = &templateCopy{dir: dir}
		m.copy = cur
		m.dropCopy(old)
	}
	cur.clones++
	cur.active++
	return cur.dir, func() {
		m.copyMu.Lock()
		defer m.copyMu.Unlock()
		cur.active--
		m.dropCopy(cur)
	}, nil
}

// dropCopy removes a copy that is not the current one once no entry
// clones it; copyMu held. The entries that cloned it keep their blocks.
func (m *Instances) dropCopy(c *templateCopy) {
	if c == nil || c == m.copy || c.active > 0 {
		return
	}
	if err := os.RemoveAll(c.dir); err != nil {
		m.Logger.Warn("remove a copy of the pool template", "copy", c.dir, "error", err)
	}
}

// copyTemplate makes a byte copy of the template's cluster in a new
// directory of tpl, without its WAL (no entry clones it).
func (m *Instances) copyTemplate(ctx context.Context, tpl string, nice int) (string, error) {
	begin := time.Now()
	dir := filepath.Join(tpl, templateCopyPrefix+randomName())
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	if err := volume.NoCOWDir(dir); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	stats, err := treecopy.Tree(ctx, filepath.Join(tpl, "pgdata"), filepath.Join(dir, "pgdata"), treecopy.Options{
		Nice: nice, Skip: skipInCopies, Unshared: true,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	m.Logger.Info("pool template copied for the next entries to clone", "copy", dir, "files", stats.Files,
		"mb", stats.Bytes>>20, "ms", time.Since(begin).Milliseconds())
	return dir, nil
}

// removeTemplateCopies removes the copies in the template directory tpl:
// at cleanPool, when nothing of this process clones them, and what an
// earlier keeper of the pool left.
func (m *Instances) removeTemplateCopies(tpl string) {
	m.copyMu.Lock()
	defer m.copyMu.Unlock()
	m.copy = nil
	entries, _ := os.ReadDir(tpl)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), templateCopyPrefix) {
			if err := os.RemoveAll(filepath.Join(tpl, e.Name())); err != nil {
				m.Logger.Warn("remove a copy of the pool template", "copy", e.Name(), "error", err)
			}
		}
	}
}
