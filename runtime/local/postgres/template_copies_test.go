package postgres

import (
	"crypto/rand"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"dbcloud/runtime/local/internal/treecopy"
	"dbcloud/runtime/local/internal/volume"
	"dbcloud/runtime/local/internal/volume/volumetest"
)

// TestCloneSource_FanOut: on btrfs with quotas, pool entries clone a copy
// of the template that at most templateFanOut of them share; each copy is
// a byte copy sharing no block with the template or another copy, a copy
// goes once the entries cloning it are done and a newer one took its
// place, and cleanPool's removal leaves none. Without volumes, entries
// clone the template itself.
func TestCloneSource_FanOut(t *testing.T) {
	ctx := t.Context()
	base := volumetest.BtrfsDir(t, 1<<30)
	fsys, err := volume.Probe(ctx, base)
	if err != nil || !fsys.Quotas {
		t.Fatalf("probe %s: %+v %v, want quotas", base, fsys, err)
	}
	tpl := filepath.Join(base, "template-k")
	data := make([]byte, 256<<10)
	rand.Read(data)
	if err := os.MkdirAll(filepath.Join(tpl, "pgdata", "base"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tpl, "pgdata", "base", "1259"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tpl, "pgdata", "postmaster.opts"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := &Instances{Logger: slog.New(slog.DiscardHandler), volumes: volume.New(fsys), templateFanOut: 2}

	// Five entries, the first two held open together: the copy they share
	// stays while either clones it.
	var sources []string
	var releases []func()
	blocks := map[string]uint64{}
	for i := range 5 {
		src, release, err := m.cloneSource(ctx, tpl, 0)
		if err != nil {
			t.Fatal(err)
		}
		sources, releases = append(sources, src), append(releases, release)
		entry := filepath.Join(base, "entry"+string(rune('a'+i)))
		if err := os.Mkdir(entry, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := treecopy.Tree(ctx, filepath.Join(src, "pgdata"), filepath.Join(entry, "pgdata"), treecopy.Options{Skip: skipInCopies}); err != nil {
			t.Fatal(err)
		}
		blocks[entry] = firstBlock(t, filepath.Join(entry, "pgdata", "base", "1259"))
		if i > 0 {
			release()
		}
	}
	if sources[0] != sources[1] || sources[2] != sources[3] || sources[1] == sources[2] || sources[3] == sources[4] {
		t.Errorf("sources %v: want a new copy every 2 entries", sources)
	}
	for _, src := range sources {
		if filepath.Dir(src) != tpl {
			t.Errorf("copy %s is not in the template's directory", src)
		}
	}
	if _, err := os.Stat(filepath.Join(sources[0], "pgdata", "postmaster.opts")); !os.IsNotExist(err) {
		t.Errorf("the copy has the template's postmaster.opts: %v", err)
	}
	// Clones of one copy share its blocks; other copies' do not, nor the
	// template's.
	a, b, c, e := blocks[filepath.Join(base, "entrya")], blocks[filepath.Join(base, "entryb")], blocks[filepath.Join(base, "entryc")], blocks[filepath.Join(base, "entrye")]
	if a != b {
		t.Errorf("entries of one copy do not share blocks: %d and %d", a, b)
	}
	if tb := firstBlock(t, filepath.Join(tpl, "pgdata", "base", "1259")); a == c || c == e || a == tb || c == tb {
		t.Errorf("blocks shared across copies: template %d, entries a %d, c %d, e %d", tb, a, c, e)
	}
	// The second copy is gone (no entry clones it, a newer one is
	// current); the first stays until its first entry is done.
	if _, err := os.Stat(sources[2]); !os.IsNotExist(err) {
		t.Errorf("superseded copy %s left: %v", sources[2], err)
	}
	if _, err := os.Stat(sources[0]); err != nil {
		t.Errorf("copy %s removed while an entry clones it: %v", sources[0], err)
	}
	releases[0]()
	if _, err := os.Stat(sources[0]); !os.IsNotExist(err) {
		t.Errorf("superseded copy %s left after its last entry: %v", sources[0], err)
	}
	m.removeTemplateCopies(tpl)
	if left, _ := filepath.Glob(filepath.Join(tpl, templateCopyPrefix+"*")); len(left) > 0 {
		t.Errorf("copies left after removeTemplateCopies: %v", left)
	}

	plain := &Instances{Logger: slog.New(slog.DiscardHandler)}
	if src, release, err := plain.cloneSource(ctx, tpl, 0); err != nil || src != tpl {
		t.Errorf("without volumes: source %q %v, want the template", src, err)
	} else {
		release()
	}
}

// firstBlock is the physical address of a file's first extent (FIEMAP),
// which clones of one file share.
func firstBlock(t *testing.T, path string) uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// struct fiemap with room for one struct fiemap_extent.
	type extent struct {
		logical, physical, length uint64
		_                         [2]uint64
		flags                     uint32
		_                         [3]uint32
	}
	var req struct {
		start, length                  uint64
		flags, mapped, count, reserved uint32
		extents                        [1]extent
	}
	req.length, req.count = ^uint64(0), 1
	req.flags = 1 // FIEMAP_FLAG_SYNC: delayed allocation resolved first
	const fsIocFiemap = 0xC020660B
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&req))); errno != 0 {
		t.Fatalf("FIEMAP %s: %v", path, errno)
	}
	if req.mapped == 0 {
		t.Fatalf("FIEMAP %s: no extent", path)
	}
	return req.extents[0].physical
}
