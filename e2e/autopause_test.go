package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// autoPauseSecond is how long one second of idle_seconds lasts for the
// tests (dbcloud serve --test-auto-pause-second): the minimum of 60 is
// then 1.2 s of the idle clock, not a minute.
const autoPauseSecond = "20ms"

// wakeHeldLog is the server's log line once a paused service's endpoints
// listen for its wake.
const wakeHeldLog = "auto-paused service's endpoints held for wake on connect"

// setAutoPause turns a service's auto-pause on (or off with 0).
func (s *server) setAutoPause(id string, idle int) {
	s.t.Helper()
	var out struct {
		AutoPause *struct {
			IdleSeconds int `json:"idle_seconds"`
		} `json:"auto_pause"`
	}
	if code := s.call("POST", s.services()+"/"+id+"/setAutoPause", map[string]int{"idle_seconds": idle}, &out); code != 200 {
		s.t.Fatalf("setAutoPause %d: %d", idle, code)
	}
	if (out.AutoPause != nil) != (idle != 0) {
		s.t.Fatalf("setAutoPause %d answered auto_pause %+v", idle, out.AutoPause)
	}
}

// countStatus counts the services of the server's project in status want.
func (s *server) countStatus(want string) int {
	s.t.Helper()
	var list []service
	if code := s.call("GET", s.services(), nil, &list); code != 200 {
		s.t.Fatalf("list services: %d", code)
	}
	n := 0
	for _, svc := range list {
		if svc.Status == want {
			n++
		}
	}
	return n
}

// opTypes lists the types of a service's operations, oldest first, each
// with who asked ("type/system" for dbcloud's own).
func (s *server) opTypes(id string) string {
	s.t.Helper()
	ops := s.operations(id)
	var out []string
	for i := len(ops) - 1; i >= 0; i-- {
		t := ops[i].Type
		if ops[i].RequestedBy.System != "" {
			t += "/" + ops[i].RequestedBy.System
		}
		out = append(out, t)
	}
	return strings.Join(out, " ")
}

// selectOne connects with dsn and runs a query: what a client that finds
// the service paused does.
func selectOne(t *testing.T, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The client waits as long as it is willing to: on a busy machine a
	// wake may take longer than connect's usual 5 s.
	c, err := pgx.Connect(ctx, strings.Replace(dsn, "connect_timeout=5", "connect_timeout=60", 1))
	if err != nil {
		t.Fatalf("connect to a paused service: %v", err)
	}
	defer c.Close(ctx)
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("query after wake: %d %v", one, err)
	}
}

// TestAutoPause_WakeOnConnect: a service with idle_seconds 60 and no
// client pauses (an auto_pause operation by dbcloud, no postmaster left);
// a client that connects to its endpoint is held while it wakes and its
// query answers; the same through its pooler's endpoint and its VPC
// address; a restart of dbcloud keeps a paused service's endpoints; a
// stopped service is not woken.
func TestAutoPause_WakeOnConnect(t *testing.T) {
	s := newServer(t, "--test-auto-pause-second", autoPauseSecond)
	svc := s.create(map[string]any{"name": "idle"})
	id, pw := svc.ServiceID, svc.InitialPassword
	svc = s.waitStatus(id, "READY", readyWithin())
	s.setAutoPause(id, 60)
	s.waitStatus(id, "PAUSED", 2*time.Minute)
	if pms := s.postmasters(id); len(pms) != 0 {
		t.Fatalf("auto-paused service still has postmasters %v", pms)
	}
	var paused struct {
		PausedAt *time.Time `json:"paused_at"`
	}
	s.call("GET", s.services()+"/"+id, nil, &paused)
	if paused.PausedAt == nil {
		t.Error("auto-paused service shows no paused_at")
	}
	direct := s.dsn(svc, pw)
	selectOne(t, direct)
	s.waitStatus(id, "READY", time.Minute)
	if got := s.opTypes(id); !strings.HasSuffix(got, "auto_pause/dbcloud wake/dbcloud") {
		t.Errorf("operations: %s, want auto_pause and wake by dbcloud last", got)
	}

	t.Run("Pooler", func(t *testing.T) {
		if code := s.call("POST", s.services()+"/"+id+"/enablePooler", nil, nil); code != 200 {
			t.Fatalf("enablePooler: %d", code)
		}
		addr := s.waitPooler(id, true, time.Minute)
		s.waitStatus(id, "PAUSED", 2*time.Minute)
		selectOne(t, s.poolerDSN(addr, pw))
		s.waitStatus(id, "READY", time.Minute)
	})

	t.Run("AfterRestart", func(t *testing.T) {
		s.waitStatus(id, "PAUSED", 2*time.Minute)
		offset := s.logOffset()
		s.restart()
		// The engine's first rounds give the paused service its
		// endpoints back.
		for deadline := time.Now().Add(time.Minute); len(s.logLines(offset, wakeHeldLog, id)) == 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the endpoints of the paused service were not held again after a restart")
			}
		}
		selectOne(t, direct)
		s.waitStatus(id, "READY", time.Minute)
	})

	t.Run("VPC", func(t *testing.T) {
		var vpc struct{ ID string }
		if code := s.call("POST", "/projects/"+s.boot.ProjectID+"/vpcs", map[string]string{"name": "net", "cidr": "10.0.0.0/16", "region_code": "local"}, &vpc); code != 201 {
			t.Fatalf("create VPC: %d", code)
		}
		if code := s.call("POST", s.services()+"/"+id+"/attachToVPC", map[string]string{"vpc_id": vpc.ID}, nil); code != 202 {
			t.Fatalf("attach: %d", code)
		}
		s.waitStatus(id, "READY", time.Minute)
		var got vpcService
		s.call("GET", s.services()+"/"+id, nil, &got)
		if got.VPCEndpoint == nil {
			t.Fatal("no VPC endpoint after attach")
		}
		viaVPC := svc
		viaVPC.Endpoint.Host, viaVPC.Endpoint.Port = got.VPCEndpoint.Host, got.VPCEndpoint.Port
		s.waitStatus(id, "PAUSED", 2*time.Minute)
		selectOne(t, s.dsn(viaVPC, pw))
		s.waitStatus(id, "READY", time.Minute)
	})

	t.Run("StoppedStaysRefused", func(t *testing.T) {
		s.setAutoPause(id, 0)
		if code := s.call("POST", s.services()+"/"+id+"/stop", nil, nil); code != 202 {
			t.Fatalf("stop: %d", code)
		}
		s.waitStatus(id, "PAUSED", time.Minute)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, direct); err == nil {
			c.Close(ctx)
			t.Fatal("a stopped service accepted a connection")
		}
		if got, _ := s.get(id); got.Status != "PAUSED" {
			t.Errorf("a connection to a stopped service made it %s", got.Status)
		}
	})
}

// TestAutoPause_WakeRefusedWhenFull: a wake is admitted as a start: with
// the project's CPU taken by another service meanwhile, the client of the
// paused one is told why, as PostgreSQL's FATAL, not left hanging, and the
// service stays paused.
func TestAutoPause_WakeRefusedWhenFull(t *testing.T) {
	s := newServer(t, "--test-auto-pause-second", autoPauseSecond, "--quota-cpu-millis", "500")
	svc := s.create(map[string]any{"name": "idle"})
	id := svc.ServiceID
	svc = s.waitStatus(id, "READY", readyWithin())
	s.setAutoPause(id, 60)
	s.waitStatus(id, "PAUSED", 2*time.Minute)
	other := s.create(map[string]any{"name": "busy"})
	s.waitStatus(other.ServiceID, "READY", readyWithin())

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, s.dsn(svc, svc.InitialPassword))
	if err == nil {
		c.Close(ctx)
		t.Fatal("the wake of a service over quota was admitted")
	}
	if !strings.Contains(err.Error(), "is paused and could not be resumed") || !strings.Contains(err.Error(), "FATAL") {
		t.Fatalf("the client was told %q, want the FATAL of a refused wake", err)
	}
	t.Logf("client saw: %v", err)
	// psql shows it too, over TLS verified against the CA.
	psql := exec.CommandContext(ctx, filepath.Join(pgBin, "psql"), s.dsn(svc, svc.InitialPassword), "-c", "SELECT 1")
	out, err := psql.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "FATAL:  service "+id+" is paused and could not be resumed: ") {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	t.Logf("psql saw: %s", out)
	if got, _ := s.get(id); got.Status != "PAUSED" {
		t.Errorf("after a refused wake: %s", got.Status)
	}
}

// TestAutoPause_WakeDiskFull: a wake that fails because the disk under
// the service is full (an ext4 image of the test's own, filled as an
// unprivileged writer would) closes the client's connection with the
// FATAL of a failed wake saying so, not a hang; the service stays PAUSED
// with nothing pending, its endpoints still wake it (a second client is
// told the same, not refused by the kernel), and once space is freed the
// next connection wakes it and is served.
func TestAutoPause_WakeDiskFull(t *testing.T) {
	dir := mountImage(t, "ext4", "8G")
	s := newServerIn(t, dir, "--test-auto-pause-second", autoPauseSecond, "--pool-size", "1", "--storage-image-gib", "0",
		"--storage-shared-mib", "1024", "--storage-mib-per-memory-gib", "256")
	svc := s.create(map[string]any{"name": "full", "cpu_millis": "shared", "memory_gbs": "shared"})
	id, pw := svc.ServiceID, svc.InitialPassword
	svc = s.waitStatus(id, "READY", readyWithin())
	s.setAutoPause(id, 60)
	s.waitStatus(id, "PAUSED", 2*time.Minute)
	filler := fillDisk(t, dir, "filler")
	dsn := strings.Replace(s.dsn(svc, pw), "connect_timeout=5", "connect_timeout=60", 1)

	refusedWake := func(attempt int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, dsn)
		if err == nil {
			c.Close(ctx)
			t.Fatalf("client %d: a service on a full disk woke", attempt)
		}
		if msg := err.Error(); !strings.Contains(msg, "FATAL") || !strings.Contains(msg, "is paused and could not be resumed") || !strings.Contains(msg, "disk") {
			t.Fatalf("client %d was told %q, want the FATAL of a wake that failed for a full disk", attempt, err)
		}
		t.Logf("client %d saw: %v", attempt, err)
		// Refused by admission or failed in its start, the wake leaves
		// nothing pending and the service paused.
		waitFor(t, "the service paused again, nothing pending", 2*time.Minute, func() bool {
			got, _ := s.get(id)
			ops := s.operations(id)
			return got.Status == "PAUSED" && len(ops) > 0 && ops[0].State != "pending"
		})
	}
	refusedWake(1)
	// Its endpoints are held again: a second client wakes it again, and
	// is told the same.
	refusedWake(2)
	if pms := s.postmasters(id); len(pms) != 0 {
		t.Fatalf("postmasters %v of a service paused on a full disk", pms)
	}

	if err := os.RemoveAll(filler); err != nil {
		t.Fatal(err)
	}
	selectOne(t, dsn)
	s.waitStatus(id, "READY", time.Minute)
	if ops := s.operations(id); ops[0].Type != "wake" || ops[0].State != "succeeded" {
		t.Errorf("last operation %s %s, want the wake succeeded", ops[0].Type, ops[0].State)
	}
}

// wakeBurst is how many paused services TestAutoPause_WakeBurst wakes at
// once, and wakeBurstRoom how many of them the project's quota admits.
const (
	wakeBurst     = 50
	wakeBurstRoom = 45
)

// TestAutoPause_WakeBurst: 50 clients connect at once to 50 paused
// services. Each wake is admitted as a start is, under the project's
// instance quota, with nothing over-admitted however the wakes interleave:
// the 45 the quota has room for hold their clients and serve them, and
// every other client is told why with the FATAL of a refused wake, not
// left hanging; the refused services stay paused.
func TestAutoPause_WakeBurst(t *testing.T) {
	awake := 10 // services kept READY beside the paused ones
	quota := wakeBurstRoom + awake
	lo, hi := portSpan(t, wakeBurst+awake+20)
	s := newServer(t, "--test-auto-pause-second", autoPauseSecond, "--port-min", strconv.Itoa(lo), "--port-max", strconv.Itoa(hi),
		"--quota-services", strconv.Itoa(wakeBurst+awake), "--quota-instances", strconv.Itoa(wakeBurst+awake))
	boot := key{AccessKey: s.boot.AccessKey, SecretKey: s.boot.SecretKey, ProjectID: s.boot.ProjectID}
	made := s.createShared(boot, "paused-", wakeBurst)
	if t.Failed() {
		t.FailNow()
	}
	for _, svc := range made {
		s.waitStatus(svc.ServiceID, "READY", readyWithin())
		s.setAutoPause(svc.ServiceID, 60)
	}
	for _, svc := range made {
		s.waitStatus(svc.ServiceID, "PAUSED", 5*time.Minute)
	}
	// The other services take the room above the burst's: the quota is
	// lowered with a restart, which keeps the paused services' endpoints.
	s.createShared(boot, "awake-", awake)
	s.stop()
	s.args = append(s.args, "--quota-instances", strconv.Itoa(quota)) // the last one counts
	s.start()
	waitFor(t, "the awake services READY", 5*time.Minute, func() bool {
		return s.countStatus("READY") == awake
	})

	// Each served client keeps its session open until the counts are
	// read: a woken service with no client pauses again after its idle
	// time (a second or so under the test's clock).
	var served, refused atomic.Int32
	var answered, closed sync.WaitGroup
	release := make(chan struct{})
	for _, svc := range made {
		answered.Add(1)
		closed.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			id := svc.ServiceID
			dsn := strings.Replace(s.dsn(svc, svc.InitialPassword), "connect_timeout=5", "connect_timeout=180", 1)
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				if strings.Contains(err.Error(), "is paused and could not be resumed") {
					refused.Add(1)
				} else {
					t.Errorf("client of %s: %v", id, err)
				}
				answered.Done()
				return
			}
			defer c.Close(context.Background())
			var one int
			if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Errorf("query of %s after its wake: %d %v", id, one, err)
			} else {
				served.Add(1)
			}
			answered.Done()
			<-release
		})
	}
	answered.Wait()
	defer closed.Wait()
	defer close(release)
	t.Logf("a burst of %d: %d served, %d refused", wakeBurst, served.Load(), refused.Load())
	if served.Load() != wakeBurstRoom || refused.Load() != wakeBurst-wakeBurstRoom {
		t.Errorf("served %d and refused %d of %d; want the %d the quota has room for served and the rest refused",
			served.Load(), refused.Load(), wakeBurst, wakeBurstRoom)
	}
	waitFor(t, "the woken services READY", 5*time.Minute, func() bool {
		return s.countStatus("READY") == awake+wakeBurstRoom
	})
	if n := s.countStatus("PAUSED"); n != wakeBurst-wakeBurstRoom {
		t.Errorf("%d services paused after the burst, want the %d refused", n, wakeBurst-wakeBurstRoom)
	}
}
