package dbcloud

import (
	"strings"
	"testing"
)

// The levels rise at 90% and 95% and a read-only service stays so until
// it is below 93%: no flapping at the edge.
func TestStorageLevelOf(t *testing.T) {
	const limit = 100 << 20
	for _, c := range []struct {
		pct      int64
		readOnly bool
		want     StorageLevel
	}{
		{0, false, StorageNormal},
		{89, false, StorageNormal},
		{90, false, StorageWarning},
		{94, false, StorageWarning},
		{95, false, StorageReadOnly},
		{120, false, StorageReadOnly},
		{94, true, StorageReadOnly},
		{93, true, StorageReadOnly},
		{92, true, StorageWarning},
		{50, true, StorageNormal},
	} {
		if got := StorageLevelOf(c.pct*limit/100, limit, c.readOnly); got != c.want {
			t.Errorf("%d%% (read-only %v): level %d, want %d", c.pct, c.readOnly, got, c.want)
		}
	}
	if got := StorageLevelOf(1<<40, 0, false); got != StorageNormal {
		t.Errorf("no limit: level %d", got)
	}
	if n := StorageNotice(StorageReadOnly, 96<<20, limit); !strings.Contains(n, "96%") || !strings.Contains(n, "resize") {
		t.Errorf("read-only notice %q", n)
	}
	if n := StorageNotice(StorageNormal, 0, limit); n != "" {
		t.Errorf("normal notice %q", n)
	}
}
