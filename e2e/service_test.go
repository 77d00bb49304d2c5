package e2e

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// hostCgroups says which cgroup version dbcloud enforces limits with on
// this host, as the runtime decides it: v1 when its cpu, cpuacct and memory
// controllers are mounted, else v2 when the unified hierarchy offers cpu
// and memory; 0 when limits cannot be enforced here. It returns the mount
// points by controller (v2: under "").
func hostCgroups(t *testing.T) (int, map[string]string) {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mounts := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		fields, postFields := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(postFields) < 3 {
			continue
		}
		switch postFields[0] {
		case "cgroup":
			for _, c := range strings.Split(postFields[2], ",") {
				if c == "cpu" || c == "cpuacct" || c == "memory" {
					mounts[c] = fields[4]
				}
			}
		case "cgroup2":
			mounts[""] = fields[4]
		}
	}
	if mounts["cpu"] != "" && mounts["cpuacct"] != "" && mounts["memory"] != "" {
		return 1, mounts
	}
	if ctl, err := os.ReadFile(filepath.Join(mounts[""], "cgroup.controllers")); mounts[""] != "" && err == nil &&
		strings.Contains(" "+string(ctl)+" ", " cpu ") && strings.Contains(" "+strings.TrimSpace(string(ctl))+" ", " memory ") {
		return 2, mounts
	}
	return 0, mounts
}

// instanceLimits reads an instance's CPU quota (µs per 100 ms; -1 for none)
// and memory limit (bytes; -1 for none) from its cgroup, failing the test
// when this host enforces limits and the instance has no group.
func instanceLimits(t *testing.T, instance string) (quota, memory int64, enforced bool) {
	t.Helper()
	version, mounts := hostCgroups(t)
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("limits are enforced on this host (cgroup v%d), but %v", version, err)
		}
		return strings.TrimSpace(string(b))
	}
	num := func(v string) int64 {
		if v == "max" || v == "-1" {
			return -1
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("cgroup value %q: %v", v, err)
		}
		return n
	}
	switch version {
	case 1:
		return num(read(filepath.Join(mounts["cpu"], "dbcloud", instance, "cpu.cfs_quota_us"))),
			num(read(filepath.Join(mounts["memory"], "dbcloud", instance, "memory.limit_in_bytes"))), true
	case 2:
		dir := filepath.Join(mounts[""], "dbcloud", instance)
		q, _, _ := strings.Cut(read(filepath.Join(dir, "cpu.max")), " ")
		return num(q), num(read(filepath.Join(dir, "memory.max"))), true
	}
	return 0, 0, false
}

func TestService_Lifecycle(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "life"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	pw := created.InitialPassword

	db := s.mustConnect(svc, pw)
	if _, err := db.Exec(ctx, `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before stop')`); err != nil {
		t.Fatal(err)
	}
	var ssl bool
	db.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl)
	if !ssl {
		t.Error("the connection is not TLS")
	}
	db.Close(ctx)

	t.Run("NoTLSRefused", func(t *testing.T) {
		dsn := "postgresql://tsdbadmin:" + pw + "@127.0.0.1:" + strconv.Itoa(svc.Endpoint.Port) + "/tsdb?sslmode=disable"
		if c, err := pgxConnect(ctx, dsn); err == nil {
			c.Close(ctx)
			t.Error("a connection without TLS was accepted")
		}
	})

	t.Run("StopStartKeepsData", func(t *testing.T) {
		if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/stop", nil, nil); code != 202 {
			t.Fatalf("stop: %d", code)
		}
		s.waitStatus(svc.ServiceID, "PAUSED", 30*time.Second)
		if len(s.postmasters(svc.ServiceID)) != 0 {
			t.Error("a postmaster runs for a PAUSED service")
		}
		if _, err := s.connect(ctx, svc, pw); err == nil {
			t.Error("a PAUSED service accepted a connection")
		}
		s.call("POST", s.services()+"/"+svc.ServiceID+"/start", nil, nil)
		again := s.waitStatus(svc.ServiceID, "READY", 30*time.Second)
		if again.Endpoint != svc.Endpoint {
			t.Errorf("endpoint moved from %v to %v", svc.Endpoint, again.Endpoint)
		}
		var v string
		if err := s.mustConnect(again, pw).QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != "before stop" {
			t.Errorf("row after restart: %q, %v", v, err)
		}
	})

	t.Run("Resize", func(t *testing.T) {
		if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/resize", map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}, nil); code != 202 {
			t.Fatalf("resize: %d", code)
		}
		s.waitStatus(svc.ServiceID, "READY", 60*time.Second)
		var sb, mc string
		c := s.mustConnect(svc, pw)
		c.QueryRow(ctx, `SHOW shared_buffers`).Scan(&sb)
		c.QueryRow(ctx, `SHOW max_connections`).Scan(&mc)
		if sb != "1GB" || mc != "50" {
			t.Errorf("after resize to 1000/4: shared_buffers %s, max_connections %s; want 1GB, 50", sb, mc)
		}
		if quota, memory, enforced := instanceLimits(t, svc.ServiceID+"-0"); !enforced {
			t.Log("this host cannot enforce limits (no cgroup v1 cpu and memory, no cgroup v2 offering them): not checked")
		} else if quota != 100000 || memory != 4<<30 {
			t.Errorf("limits after resize to 1000/4: CPU quota %d µs per 100 ms, memory %d bytes; want 100000 and %d", quota, memory, int64(4)<<30)
		}
		var v string
		if err := c.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil {
			t.Errorf("data after resize: %v", err)
		}
	})

	t.Run("UpdatePassword", func(t *testing.T) {
		const newPW = "a-new-password-42"
		if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/updatePassword", map[string]string{"password": newPW}, nil); code != 204 {
			t.Fatalf("updatePassword: %d", code)
		}
		// In effect before the 204: no waiting.
		c, err := s.connect(ctx, svc, newPW)
		if err != nil {
			t.Fatalf("new password: %v", err)
		}
		c.Close(ctx)
		_, err = s.connect(ctx, svc, pw)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Errorf("old password: %v, want invalid_password (28P01)", err)
		}
		pw = newPW
	})

	t.Run("Metrics", func(t *testing.T) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, _ := s.get(svc.ServiceID)
			if m := got.Metrics; m != nil && m.MemoryMB > 0 && m.StorageMB > 0 {
				t.Logf("metrics: %d millicores, %d MB memory, %d MB storage", m.MilliCPU, m.MemoryMB, m.StorageMB)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no metrics: %+v", got.Metrics)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("Delete", func(t *testing.T) {
		if code := s.call("DELETE", s.services()+"/"+svc.ServiceID, nil, nil); code != 202 {
			t.Fatalf("delete: %d", code)
		}
		s.waitGone(svc.ServiceID, 30*time.Second)
		if pids := s.postmasters(svc.ServiceID); len(pids) != 0 {
			t.Errorf("postmasters %v still run", pids)
		}
		if _, err := os.Stat(filepath.Join(s.dir, "runtime", "services", svc.ServiceID)); !os.IsNotExist(err) {
			t.Errorf("service directory remains: %v", err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(svc.Endpoint.Port))
		if err != nil {
			t.Errorf("port %d not freed: %v", svc.Endpoint.Port, err)
		} else {
			ln.Close()
		}
	})
}

func TestService_ResizeWhilePaused(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "paused", "cpu_millis": "shared"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	s.call("POST", s.services()+"/"+svc.ServiceID+"/stop", nil, nil)
	s.waitStatus(svc.ServiceID, "PAUSED", 30*time.Second)
	var got service
	s.call("POST", s.services()+"/"+svc.ServiceID+"/resize", map[string]string{"cpu_millis": "500", "memory_gbs": "2"}, &got)
	if got.Status != "PAUSED" || len(s.postmasters(svc.ServiceID)) != 0 {
		t.Fatalf("resize of a PAUSED service: %s, postmasters %v", got.Status, s.postmasters(svc.ServiceID))
	}
	s.call("POST", s.services()+"/"+svc.ServiceID+"/start", nil, nil)
	s.waitStatus(svc.ServiceID, "READY", 30*time.Second)
	var sb string
	s.mustConnect(svc, created.InitialPassword).QueryRow(ctx, `SHOW shared_buffers`).Scan(&sb)
	if sb != "512MB" {
		t.Errorf("shared_buffers after start = %s, want 512MB (the 500/2 size)", sb)
	}
}

func TestService_Capacity(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--pool-size", "0")
	var e service
	code := s.call("POST", s.services(), map[string]any{"name": "huge", "cpu_millis": "32000"}, &e)
	// A refusal the caller can act on is a 4xx with the error body, which
	// the original's CLI prints (it prints "unknown error" for a 5xx).
	if code != 409 || e.Code != "CAPACITY_EXCEEDED" || !strings.Contains(e.Message, "32000/128") || !strings.Contains(e.Message, "millicores") {
		t.Errorf("a size the host cannot hold: %d %s %q", code, e.Code, e.Message)
	}
	var list []service
	s.call("GET", s.services(), nil, &list)
	if len(list) != 0 {
		t.Errorf("the refused create left %d services", len(list))
	}
}
