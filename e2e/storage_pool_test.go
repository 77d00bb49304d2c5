package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStoragePool_CreatesTakeEntries: on a btrfs storage image, where each
// service's directory is a volume of its own and no rename crosses into
// it, creates still take their clusters from the pool of prepared ones:
// each claim is logged into the service's directory, none is prepared
// inline, and the directory is a volume with the service's quota.
func TestStoragePool_CreatesTakeEntries(t *testing.T) {
	s := newServer(t, "--storage-image-gib", "4", "--storage-shared-mib", "400", "--pool-size", "1")
	ctx := context.Background()
	for _, name := range []string{"first", "second"} {
		// The second takes what the pool prepared after the first.
		s.waitPool(t, 1)
		c := s.create(map[string]any{"name": name, "cpu_millis": "shared", "memory_gbs": "shared"})
		svc := s.waitStatus(c.ServiceID, "READY", 90*time.Second)
		conn := s.mustConnect(svc, c.InitialPassword)
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("service %s: %v", name, err)
		}
		conn.Close(ctx)
		dir := filepath.Join(s.dir, "runtime", "services", c.ServiceID)
		if n := s.logMessages("pool entry claimed", "dir", dir); n != 1 {
			t.Errorf("service %s: %d \"pool entry claimed\" lines for %s in the server's log, want 1", name, n, dir)
		}
		if n := s.logMessages("instance data directory prepared inline (pool empty)", "instance", c.ServiceID+"-0"); n != 0 {
			t.Errorf("service %s: its cluster was prepared inline", name)
		}
		if _, quota := serviceBytes(t, dir); quota == 0 {
			t.Errorf("service %s: its directory %s has no quota", name, dir)
		}
	}
	if n := s.logMessages("pool dir is on another filesystem than the instances; preparing clusters inline", "", ""); n != 0 {
		t.Errorf("the server warned that it prepares clusters inline")
	}
}

// logMessages counts the server's log lines with message msg and, unless
// key is "", key's value want.
func (s *server) logMessages(msg, key, want string) int {
	raw, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) == nil && entry["msg"] == msg && (key == "" || entry[key] == want) {
			n++
		}
	}
	return n
}
