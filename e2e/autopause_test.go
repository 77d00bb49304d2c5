package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
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
