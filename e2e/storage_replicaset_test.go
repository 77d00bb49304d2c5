package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStorageLimit_ReplicaSet: on a btrfs storage image a read replica
// set's directory is a volume of its own with a quota, so its nodes
// cannot fill the disk the other tenants share: the parent's hard limit
// once per node (each node is a copy of the parent), moved when the
// node count changes.
func TestStorageLimit_ReplicaSet(t *testing.T) {
	const limitMB = 400
	s := newServer(t, "--storage-image-gib", "4", "--storage-shared-mib", strconv.Itoa(limitMB),
		"--storage-mib-per-memory-gib", "1024")
	created := s.create(map[string]any{"name": "parent", "cpu_millis": "shared", "environment_tag": "PROD"})
	parent := s.waitStatus(created.ServiceID, "READY", 90*time.Second)
	var rs replicaSet
	if code := s.call("POST", s.replicaSets(parent.ServiceID), map[string]any{"name": "reads", "cpu_millis": 500, "memory_gbs": 2, "nodes": 2}, &rs); code != 202 {
		t.Fatalf("create replica set: %d %+v", code, rs)
	}
	s.waitReplicaSet(parent.ServiceID, rs.ID, "active", 2*time.Minute)
	dir := filepath.Join(s.runtimeDir(), "services", rs.ID)
	// The parent's hard limit: its limit and a headroom of 10%, at least
	// 512 MiB (runtime/local hardLimit).
	perNode := int64(limitMB+512) << 20
	if got := qgroupLimit(t, dir); got != 2*perNode {
		t.Fatalf("limit of the set's volume with 2 nodes: %d, want %d", got, 2*perNode)
	}
	var msg map[string]any
	if code := s.call("POST", s.replicaSets(parent.ServiceID)+"/"+rs.ID+"/resize", map[string]any{"cpu_millis": "500", "memory_gbs": "2", "nodes": 1}, &msg); code != 202 {
		t.Fatalf("resize to 1 node: %d %v", code, msg)
	}
	s.waitReplicaSet(parent.ServiceID, rs.ID, "active", 2*time.Minute)
	if got := qgroupLimit(t, dir); got != perNode {
		t.Fatalf("limit of the set's volume with 1 node: %d, want %d", got, perNode)
	}
}

// qgroupLimit is the limit on what the btrfs subvolume at dir references
// (`btrfs qgroup show -re -f`, the level-0 row's max referenced).
func qgroupLimit(t *testing.T, dir string) int64 {
	t.Helper()
	out, err := exec.Command("btrfs", "qgroup", "show", "--raw", "-re", "-f", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("btrfs qgroup show %s: %v: %s (is it a subvolume?)", dir, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && strings.HasPrefix(f[0], "0/") {
			if f[3] == "none" {
				return 0
			}
			n, err := strconv.ParseInt(f[3], 10, 64)
			if err != nil {
				t.Fatal(fmt.Errorf("qgroup show: %q: %w", line, err))
			}
			return n
		}
	}
	t.Fatalf("qgroup show %s: no level-0 group in %q", dir, out)
	return 0
}
