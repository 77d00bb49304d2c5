package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// key is an API key of a project other than the bootstrap one.
type key struct {
	AccessKey string `json:"access_key"`
	SecretKey string `json:"secret_key"`
	ProjectID string `json:"project_id"`
}

// admin runs `dbcloud admin` on the server's data directory.
func (s *server) admin(args ...string) []byte {
	s.t.Helper()
	cmd := exec.Command(binary, append(append([]string{"admin"}, args...), "--data-dir", s.dir, "--json")...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			s.t.Fatalf("dbcloud admin %v: %v\n%s", args, err, ee.Stderr)
		}
		s.t.Fatalf("dbcloud admin %v: %v", args, err)
	}
	return out
}

// newProject creates a project with an API key through `dbcloud admin`.
func (s *server) newProject(name string) key {
	s.t.Helper()
	var p struct{ ID string }
	if err := json.Unmarshal(s.admin("project", "create", "--name", name), &p); err != nil {
		s.t.Fatal(err)
	}
	var k key
	if err := json.Unmarshal(s.admin("key", "create", "--project", p.ID, "--name", name), &k); err != nil {
		s.t.Fatal(err)
	}
	return k
}

// doAs sends a request with another project's key; it never fails the
// test, so that goroutines can use it.
func (s *server) doAs(k key, method, path string, body any, out any) (int, error) {
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.baseURL+path, r)
	req.SetBasicAuth(k.AccessKey, k.SecretKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return res.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, raw)
		}
	}
	return res.StatusCode, nil
}

// TestUpdatePassword_TenantLockStallsNobodyElse: tenant A holds a lock on
// its role in an open transaction and calls updatePassword while project B
// creates and deletes VPCs in a loop. A's call fails with a 409 that says
// its session holds a lock; every request of B succeeds meanwhile (its
// latency is logged). Once A's transaction ends, the password changes, the
// new one works before the 204 and the old one is refused.
func TestUpdatePassword_TenantLockStallsNobodyElse(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "a", "cpu_millis": "shared"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	b := s.newProject("b")

	tenant := s.mustConnect(svc, created.InitialPassword)
	if _, err := tenant.Exec(ctx, `BEGIN; ALTER ROLE tsdbadmin PASSWORD NULL`); err != nil {
		t.Fatalf("tenant's lock: %v", err)
	}

	var (
		mu        sync.Mutex
		latencies []time.Duration
		failures  []string
		stop      = make(chan struct{})
		done      = make(chan struct{})
	)
	go func() {
		defer close(done)
		vpcs := "/projects/" + b.ProjectID + "/vpcs"
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var v struct{ ID string }
			start := time.Now()
			code, err := s.doAs(b, "POST", vpcs, map[string]string{"name": "loop", "cidr": fmt.Sprintf("10.%d.0.0/16", i%200), "region_code": "local"}, &v)
			d := time.Since(start)
			mu.Lock()
			latencies = append(latencies, d)
			if err != nil || code != 201 {
				failures = append(failures, fmt.Sprintf("create VPC: %d %v", code, err))
			}
			mu.Unlock()
			if code == 201 {
				if code, err := s.doAs(b, "DELETE", vpcs+"/"+v.ID, nil, nil); err != nil || code != 204 {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("delete VPC: %d %v", code, err))
					mu.Unlock()
				}
			}
		}
	}()
	time.Sleep(200 * time.Millisecond) // B is under way before A asks

	var e service
	start := time.Now()
	code := s.call("POST", s.services()+"/"+svc.ServiceID+"/updatePassword", map[string]string{"password": "blocked-password-1"}, &e)
	took := time.Since(start)
	time.Sleep(200 * time.Millisecond) // and B goes on after A's answer
	close(stop)
	<-done

	if code != 409 || !strings.Contains(e.Message, "holds a lock") {
		t.Errorf("updatePassword while the tenant holds its role: %d %s %q, want 409 saying its session holds a lock", code, e.Code, e.Message)
	}
	mu.Lock()
	if len(failures) > 0 || len(latencies) == 0 {
		latencies = append(latencies, 0) // keeps the log line below safe
		t.Errorf("project B: %d requests, failures %v", len(latencies), failures)
	}
	t.Logf("A's updatePassword answered %d after %v; project B: %d VPC creates, p50 %v, p99 %v, max %v",
		code, took.Round(time.Millisecond), len(latencies), percentile(latencies, 0.5).Round(time.Millisecond),
		percentile(latencies, 0.99).Round(time.Millisecond), percentile(latencies, 1).Round(time.Millisecond))
	mu.Unlock()

	if _, err := tenant.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	// The refused change left the old password in force.
	if c, err := s.connect(ctx, svc, created.InitialPassword); err != nil {
		t.Errorf("old password after the refused change: %v", err)
	} else {
		c.Close(ctx)
	}
	const newPW = "after-the-lock-42"
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/updatePassword", map[string]string{"password": newPW}, nil); code != 204 {
		t.Fatalf("updatePassword after the lock ended: %d", code)
	}
	c, err := s.connect(ctx, svc, newPW)
	if err != nil {
		t.Fatalf("new password: %v", err)
	}
	c.Close(ctx)
	_, err = s.connect(ctx, svc, created.InitialPassword)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
		t.Errorf("old password: %v, want invalid_password (28P01)", err)
	}
}

// TestAdmission_RealHost: on the real host, with the project's quota
// (`dbcloud admin project set-quota`) at 3 running instances, all taken by
// a primary, its HA standby and a read replica node, every operation that
// adds or grows instances is 409 QUOTA_EXCEEDED (or CAPACITY_EXCEEDED for
// a size beyond the host) saying what is free, and changes nothing: every
// service keeps its status and instances.
func TestAdmission_RealHost(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	quota := func(n string) { s.admin("project", "set-quota", "--project", s.boot.ProjectID, "--instances", n) }
	quota("4")
	a := s.create(map[string]any{"name": "a", "cpu_millis": "shared", "replica_count": 1})
	b := s.create(map[string]any{"name": "b", "cpu_millis": "shared"})
	s.waitStatus(a.ServiceID, "READY", 90*time.Second)
	s.waitStatus(b.ServiceID, "READY", 60*time.Second)
	if code := s.call("POST", s.services()+"/"+b.ServiceID+"/stop", nil, nil); code != 202 {
		t.Fatalf("stop b: %d", code)
	}
	s.waitStatus(b.ServiceID, "PAUSED", 60*time.Second)
	var rs replicaSet
	if code := s.call("POST", s.replicaSets(a.ServiceID), map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}, &rs); code != 202 {
		t.Fatalf("create replica set: %d %s", code, rs.Message)
	}
	s.waitReplicaSet(a.ServiceID, rs.ID, "active", 90*time.Second)
	quota("3") // a, its standby and the replica node: nothing is free

	state := func() string {
		var list []service
		s.call("GET", s.services(), nil, &list)
		var sets []replicaSet
		s.call("GET", s.replicaSets(a.ServiceID), nil, &sets)
		out := ""
		for _, x := range list {
			out += fmt.Sprintf("%s %s %d; ", x.ServiceID, x.Status, len(x.Resources))
		}
		for _, r := range sets {
			out += fmt.Sprintf("set %s %s %d; ", r.ID, r.Status, r.Nodes)
		}
		return out
	}
	before := state()
	path := s.services() + "/" + a.ServiceID
	for _, tc := range []struct {
		name, method, path string
		body               any
		code               string
	}{
		{"create", "POST", s.services(), map[string]any{"name": "c", "cpu_millis": "shared"}, "QUOTA_EXCEEDED"},
		{"fork", "POST", path + "/forkService", map[string]any{"fork_strategy": "NOW", "cpu_millis": "shared"}, "QUOTA_EXCEEDED"},
		{"resize beyond the host", "POST", path + "/resize", map[string]string{"cpu_millis": "32000", "memory_gbs": "128"}, "CAPACITY_EXCEEDED"},
		{"setHA", "POST", path + "/setHA", map[string]int{"replica_count": 2}, "QUOTA_EXCEEDED"},
		{"replica set create", "POST", s.replicaSets(a.ServiceID), map[string]any{"name": "r2", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}, "QUOTA_EXCEEDED"},
		{"replica set resize", "POST", s.replicaSets(a.ServiceID) + "/" + rs.ID + "/resize", map[string]any{"cpu_millis": "500", "memory_gbs": "2", "nodes": 2}, "QUOTA_EXCEEDED"},
		{"start of a PAUSED service", "POST", s.services() + "/" + b.ServiceID + "/start", nil, "QUOTA_EXCEEDED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e service
			code := s.call(tc.method, tc.path, tc.body, &e)
			if code != 409 || e.Code != tc.code || !strings.Contains(e.Message, "free") {
				t.Errorf("%d %s %q, want 409 %s saying what is free", code, e.Code, e.Message, tc.code)
			}
			t.Logf("%s: %s", tc.name, e.Message)
			if after := state(); after != before {
				t.Errorf("the refusal changed something:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
	// Shrinking is always admitted, even at the quota.
	s.admin("project", "set-quota", "--project", s.boot.ProjectID, "--default")
	if code := s.call("POST", path+"/setHA", map[string]int{"replica_count": 0}, nil); code != 202 {
		t.Errorf("setHA down: %d", code)
	}
	s.waitStatus(a.ServiceID, "READY", 60*time.Second)
}

// TestPooler_UnstableRepair: with PgBouncer missing, enablePooler leaves the
// service UNSTABLE with the reason; disablePooler, a correction, is
// accepted on it and brings it back to READY.
func TestPooler_UnstableRepair(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--pgbouncer", "/nonexistent/pgbouncer")
	created := s.create(map[string]any{"name": "pool", "cpu_millis": "shared"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	path := s.services() + "/" + svc.ServiceID
	if code := s.call("POST", path+"/enablePooler", nil, nil); code != 200 {
		t.Fatalf("enablePooler: %d", code)
	}
	// The change in flight is visible.
	if got, _ := s.get(svc.ServiceID); got.Status != "CONFIGURING" && got.Status != "UNSTABLE" {
		t.Errorf("status right after enablePooler: %s, want CONFIGURING (or already UNSTABLE)", got.Status)
	}
	broken := s.waitStatus(svc.ServiceID, "UNSTABLE", 60*time.Second)
	if !strings.Contains(broken.StatusReason, "PgBouncer") {
		t.Errorf("status_reason %q does not name PgBouncer", broken.StatusReason)
	}
	var e service
	if code := s.call("POST", path+"/disablePooler", nil, &e); code != 200 {
		t.Fatalf("disablePooler on UNSTABLE: %d %s %s", code, e.Code, e.Message)
	}
	s.waitStatus(svc.ServiceID, "READY", 60*time.Second)
	c := s.mustConnect(svc, created.InitialPassword)
	if err := c.Ping(context.Background()); err != nil {
		t.Errorf("service after the repair: %v", err)
	}
}

// TestCrashBetweenCommitAndResponse: dbcloud is killed (SIGKILL, by a test
// hook) after a create committed and before it answered; after a restart,
// the retry with the same Idempotency-Key answers the same service with
// its initial_password, which then logs in.
func TestCrashBetweenCommitAndResponse(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.stop()
	s.env = []string{"DBCLOUD_TEST_CRASH_AFTER_COMMIT=1"}
	s.start()
	body := map[string]any{"name": "crash", "cpu_millis": "shared"}
	send := func() (int, service, error) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", s.baseURL+s.services(), bytes.NewReader(b))
		req.SetBasicAuth(s.boot.AccessKey, s.boot.SecretKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "crash-create-1")
		res, err := s.client.Do(req)
		if err != nil {
			return 0, service{}, err
		}
		defer res.Body.Close()
		var out service
		raw, _ := io.ReadAll(res.Body)
		json.Unmarshal(raw, &out)
		return res.StatusCode, out, nil
	}
	if code, _, err := send(); err == nil {
		t.Fatalf("the create was answered (%d) although the server was to die before answering", code)
	}
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not die at the hook")
	}
	s.cmd = nil
	s.log.Close()
	s.env = nil
	s.start()
	code, got, err := send()
	if err != nil || code != 202 {
		t.Fatalf("retry after the crash: %d %v", code, err)
	}
	if got.InitialPassword == "" {
		t.Fatalf("the retry after the crash has no initial_password: %+v", got)
	}
	var list []service
	s.call("GET", s.services(), nil, &list)
	if len(list) != 1 || list[0].ServiceID != got.ServiceID {
		t.Fatalf("services after the crash and retry: %+v, want only %s", list, got.ServiceID)
	}
	svc := s.waitStatus(got.ServiceID, "READY", 60*time.Second)
	c := s.mustConnect(svc, got.InitialPassword)
	if err := c.Ping(context.Background()); err != nil {
		t.Error(err)
	}
}
