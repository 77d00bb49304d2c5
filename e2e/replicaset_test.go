package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// replicaSet is what the API shows of a read replica set.
type replicaSet struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Nodes    int    `json:"nodes"`
	Status   string `json:"status"`
	Endpoint *struct {
		Host string `json:"host"`
		Port int    `json:"port"`
	} `json:"endpoint"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (s *server) replicaSets(serviceID string) string {
	return s.services() + "/" + serviceID + "/replicaSets"
}

// waitReplicaSet polls the service's sets until set id has status want.
func (s *server) waitReplicaSet(serviceID, id, want string, within time.Duration) replicaSet {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var sets []replicaSet
		if code := s.call("GET", s.replicaSets(serviceID), nil, &sets); code != 200 {
			s.t.Fatalf("list replica sets: %d", code)
		}
		var got replicaSet
		for _, r := range sets {
			if r.ID == id {
				got = r
			}
		}
		if got.Status == want || (want == "gone" && got.ID == "") {
			return got
		}
		if time.Now().After(deadline) {
			var asService service
			s.call("GET", s.services()+"/"+id, nil, &asService)
			s.t.Fatalf("replica set %s: status %q, want %q within %v (%s)", id, got.Status, want, within, asService.StatusReason)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nodesSeen opens n connections to the set's endpoint and returns the
// distinct nodes (cluster_name) that answered, checking each is a standby
// that holds want rows of table t.
func nodesSeen(t *testing.T, s *server, set service, password string, n, want int) map[string]bool {
	t.Helper()
	ctx := context.Background()
	seen := map[string]bool{}
	for range n {
		c := s.mustConnect(set, password)
		var name string
		var standby bool
		var rows int
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := c.QueryRow(ctx, "SELECT current_setting('cluster_name'), pg_is_in_recovery(), (SELECT count(*) FROM t)::int").
				Scan(&name, &standby, &rows)
			if err != nil {
				t.Fatal(err)
			}
			if rows == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s has %d rows, want %d", name, rows, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !standby {
			t.Fatalf("node %s is not in recovery", name)
		}
		seen[name] = true
		c.Close(ctx)
	}
	return seen
}

func slotsOf(t *testing.T, c *pgx.Conn, setID string) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1",
		"dbcloud_rs_"+setID+"_%").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReplicaSets runs a read replica set of a PROD service with one HA
// standby: rows written on the primary are read through the set's
// endpoint, which spreads connections over the nodes and refuses writes;
// resize adds and removes nodes (and their slots on the primary); the
// pooler works and goes; after a failover of the parent the set follows
// the new primary; delete leaves no process, slot or file.
func TestReplicaSets(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "parent", "cpu_millis": "shared", "environment_tag": "PROD", "replica_count": 1})
	parent := s.waitStatus(created.ServiceID, "READY", 90*time.Second)
	password := created.InitialPassword
	pc := s.mustConnect(parent, password)
	if _, err := pc.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}

	// Bad input changes nothing.
	var bad replicaSet
	if code := s.call("POST", s.replicaSets(parent.ServiceID), map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 0}, &bad); code != 400 {
		t.Fatalf("nodes 0: %d %+v", code, bad)
	}
	var rs replicaSet
	if code := s.call("POST", s.replicaSets(parent.ServiceID), map[string]any{"name": "reads", "cpu_millis": 500, "memory_gbs": 2, "nodes": 2}, &rs); code != 202 {
		t.Fatalf("create replica set: %d %+v", code, rs)
	}
	if rs.Status != "creating" || rs.Endpoint == nil {
		t.Fatalf("create answered %+v, want status creating and an endpoint", rs)
	}
	begin := time.Now()
	s.waitReplicaSet(parent.ServiceID, rs.ID, "active", 90*time.Second)
	t.Logf("set of 2 nodes active %v after the create", time.Since(begin).Round(time.Millisecond))
	set, code := s.get(rs.ID)
	if code != 200 || set.Status != "READY" || set.Endpoint.Port != rs.Endpoint.Port {
		t.Fatalf("GET the set as a service: %d %+v", code, set)
	}

	// Reads through the set's endpoint reach both nodes; writes fail.
	if seen := nodesSeen(t, s, set, password, 6, 100); len(seen) != 2 {
		t.Fatalf("connections reached nodes %v, want 2", seen)
	}
	rc := s.mustConnect(set, password)
	_, err := rc.Exec(ctx, "INSERT INTO t VALUES (1000)")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("write on the replica endpoint: %v, want SQLSTATE 25006 (read-only transaction)", err)
	}
	if _, err := pc.Exec(ctx, "INSERT INTO t SELECT generate_series(101, 200)"); err != nil {
		t.Fatal(err)
	}
	nodesSeen(t, s, set, password, 2, 200)
	if n := slotsOf(t, pc, rs.ID); n != 2 {
		t.Fatalf("%d slots of the set on the primary, want 2", n)
	}

	// Resize: three nodes, then one; the others' slots go with them.
	var msg map[string]any
	if code := s.call("POST", s.replicaSets(parent.ServiceID)+"/"+rs.ID+"/resize", map[string]any{"cpu_millis": "500", "memory_gbs": "2", "nodes": 3}, &msg); code != 202 {
		t.Fatalf("resize to 3 nodes: %d %v", code, msg)
	}
	s.waitReplicaSet(parent.ServiceID, rs.ID, "active", 90*time.Second)
	if seen := nodesSeen(t, s, set, password, 9, 200); len(seen) != 3 {
		t.Fatalf("after resize to 3, connections reached %v", seen)
	}
	if code := s.call("POST", s.replicaSets(parent.ServiceID)+"/"+rs.ID+"/resize", map[string]any{"cpu_millis": "500", "memory_gbs": "2", "nodes": 1}, &msg); code != 202 {
		t.Fatalf("resize to 1 node: %d %v", code, msg)
	}
	got := s.waitReplicaSet(parent.ServiceID, rs.ID, "active", 90*time.Second)
	if got.Nodes != 1 {
		t.Fatalf("nodes %d after resize, want 1", got.Nodes)
	}
	if seen := nodesSeen(t, s, set, password, 3, 200); len(seen) != 1 {
		t.Fatalf("after resize to 1, connections reached %v", seen)
	}
	if n := slotsOf(t, pc, rs.ID); n != 1 {
		t.Fatalf("%d slots of the set on the primary after removing nodes, want 1", n)
	}
	for _, n := range []string{"1", "2"} {
		if _, err := os.Stat(filepath.Join(s.dir, "runtime", "services", rs.ID, n)); !os.IsNotExist(err) {
			t.Fatalf("node %s directory still there: %v", n, err)
		}
	}

	// The pooler: reads through it, writes refused, gone when disabled.
	if code := s.call("POST", s.replicaSets(parent.ServiceID)+"/"+rs.ID+"/enablePooler", nil, &msg); code != 200 {
		t.Fatalf("enablePooler: %d %v", code, msg)
	}
	addr := s.waitPooler(rs.ID, true, 60*time.Second)
	pool, err := pgx.Connect(ctx, s.poolerDSN(addr, password))
	if err != nil {
		t.Fatalf("connect through the set's pooler: %v", err)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&rows); err != nil || rows != 200 {
		t.Fatalf("read through the pooler: %d rows, %v", rows, err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO t VALUES (1001)"); err == nil {
		t.Fatal("a write through the set's pooler succeeded")
	}
	pool.Close(ctx)
	if code := s.call("POST", s.replicaSets(parent.ServiceID)+"/"+rs.ID+"/disablePooler", nil, &msg); code != 200 {
		t.Fatalf("disablePooler: %d %v", code, msg)
	}
	s.waitPooler(rs.ID, false, 60*time.Second)

	// The parent fails over: the set follows its new primary.
	oldPrimary, _ := s.haPrimary(parent.ServiceID)
	pf, err := os.ReadFile(filepath.Join(s.dir, "runtime", "services", parent.ServiceID, strconv.Itoa(oldPrimary), "pgdata", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.SplitN(string(pf), "\n", 2)[0])
	pc.Close(ctx)
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p, _ := s.haPrimary(parent.ServiceID); p != oldPrimary {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the parent did not fail over within 60 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	parent = s.waitStatus(parent.ServiceID, "READY", 90*time.Second)
	pc = s.mustConnect(parent, password)
	if _, err := pc.Exec(ctx, "INSERT INTO t SELECT generate_series(201, 300)"); err != nil {
		t.Fatal(err)
	}
	nodesSeen(t, s, set, password, 1, 300)
	t.Logf("rows written on the new primary read through the set %v after the kill", time.Since(killed).Round(time.Millisecond))
	s.waitReplicaSet(parent.ServiceID, rs.ID, "active", 60*time.Second)

	// Delete: gone from the API, the endpoint refuses, no slot or file left.
	if code := s.call("DELETE", s.replicaSets(parent.ServiceID)+"/"+rs.ID, nil, nil); code != 202 {
		t.Fatalf("delete: %d", code)
	}
	s.waitReplicaSet(parent.ServiceID, rs.ID, "gone", 60*time.Second)
	if _, code := s.get(rs.ID); code != 404 {
		t.Fatalf("GET deleted set: %d", code)
	}
	if c, err := s.connect(ctx, set, password); err == nil {
		c.Close(ctx)
		t.Fatal("the deleted set's endpoint still accepts connections")
	}
	if n := slotsOf(t, pc, rs.ID); n != 0 {
		t.Fatalf("%d slots of the deleted set left on the primary", n)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "runtime", "services", rs.ID)); !os.IsNotExist(err) {
		t.Fatalf("the deleted set's directory is still there: %v", err)
	}
}
