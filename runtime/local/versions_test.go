package local

import "testing"

// TestPoolSizeOf: the newest version, which creates get by default, keeps
// the configured pool; each older one at most one prepared cluster.
func TestPoolSizeOf(t *testing.T) {
	both := map[int]string{15: "/15/bin", 17: "/17/bin"}
	for _, c := range []struct {
		dirs        map[int]string
		major, size int
		want        int
	}{
		{both, 17, 4, 4},
		{both, 15, 4, 1},
		{both, 15, 0, 0},
		{map[int]string{15: "/15/bin"}, 15, 4, 4},
		{nil, 15, 4, 4},
	} {
		if got := poolSizeOf(Config{BinDirs: c.dirs, PoolSize: c.size}, c.major); got != c.want {
			t.Errorf("pool of %d with %v and PoolSize %d: %d, want %d", c.major, c.dirs, c.size, got, c.want)
		}
	}
}
