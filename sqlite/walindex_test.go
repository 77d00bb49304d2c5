package sqlite

import (
	"path/filepath"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/storetest"
)

// TestNextVersion: the WAL-index header read around a Store's own commit
// is one commit on, so the counters kept stay; a second commit in between,
// by this Store or by another process's (a second Store on the file, as
// `dbcloud admin` opens it), or a header caught while being written, is
// not.
func TestNextVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dbcloud.db")
	a := openForTest(t, path)
	b := openForTest(t, path)
	version := func() string {
		t.Helper()
		v, ok := a.index.version()
		if !ok {
			t.Fatal("the WAL index is closed")
		}
		return v
	}
	n := 0
	insert := func(s *Store) {
		t.Helper()
		n++
		storetest.MustUpdate(t, s, func(tx dbcloud.Tx) error {
			return tx.InsertService(storetest.NewService("p1", "s"+string(rune('a'+n)), time.Unix(int64(n), 0)))
		})
	}
	// oneOn reports whether the header after the commits of stores, one
	// each in turn, is one commit on from the header before them.
	oneOn := func(stores ...*Store) bool {
		t.Helper()
		before := version()
		for _, s := range stores {
			insert(s)
		}
		return nextVersion(before, version())
	}
	insert(a)
	if !oneOn(a) {
		t.Errorf("one commit of this store: nextVersion false")
	}
	if oneOn(a, a) {
		t.Errorf("two commits: nextVersion true")
	}
	if !oneOn(b) {
		t.Errorf("one commit of the other store: nextVersion false (the header counts every process's commits)")
	}
	if oneOn(b, a) {
		t.Errorf("the other store's commit and this one's: nextVersion true")
	}
	before := version()
	insert(a)
	torn := []byte(version())
	torn[walIndexHeaderBytes/2+8]++ // the second copy written, the first not yet
	if nextVersion(before, string(torn)) {
		t.Errorf("a header being written: nextVersion true")
	}
	if nextVersion(before, before) {
		t.Errorf("no commit: nextVersion true")
	}
}

func openForTest(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
