package e2e

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestPassword_Persists: a password set by updatePassword stays in effect,
// and the old one stays refused, after everything that runs the runtime's
// whole ensure again and so puts the stored verifier in place: a stop and
// start, a resize and a failover.
func TestPassword_Persists(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	svc, oldPW := s.haService(t)
	const newPW = "persisted-password-7c1"
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/updatePassword", map[string]string{"password": newPW}, nil); code != 204 {
		t.Fatalf("updatePassword: %d", code)
	}
	check := func(step string) {
		t.Helper()
		ctx := context.Background()
		// The endpoint may still be switching (a failover): the new
		// password must work within the deadline, and then the old one
		// must be refused for its password, not for anything else.
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			c, err := s.connect(ctx, svc, newPW)
			if err == nil {
				var one int
				err = c.QueryRow(ctx, "SELECT 1").Scan(&one)
				c.Close(ctx)
				if err == nil {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the new password does not work: %v", step, err)
			}
		}
		c, err := s.connect(ctx, svc, oldPW)
		if err == nil {
			c.Close(ctx)
			t.Fatalf("%s: the old password works again", step)
		}
		if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "28P01" {
			t.Errorf("%s: the old password fails with %v, want SQLSTATE 28P01", step, err)
		}
	}
	check("after updatePassword")

	path := s.services() + "/" + svc.ServiceID
	if code := s.call("POST", path+"/stop", nil, nil); code != 202 {
		t.Fatalf("stop: %d", code)
	}
	s.waitStatus(svc.ServiceID, "PAUSED", 60*time.Second)
	if code := s.call("POST", path+"/start", nil, nil); code != 202 {
		t.Fatalf("start: %d", code)
	}
	s.waitStatus(svc.ServiceID, "READY", 90*time.Second)
	check("after stop and start")

	if code := s.call("POST", path+"/resize", map[string]string{"cpu_millis": "500", "memory_gbs": "2"}, nil); code != 202 {
		t.Fatalf("resize: %d", code)
	}
	s.waitStatus(svc.ServiceID, "READY", 90*time.Second)
	check("after resize")

	primary, _ := s.haPrimary(svc.ServiceID)
	killPrimary(t, filepath.Join(s.dir, "runtime", "services", svc.ServiceID, strconv.Itoa(primary)))
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		now, _ := s.haPrimary(svc.ServiceID)
		got, _ := s.get(svc.ServiceID)
		if now != primary && got.Status == "READY" && len(got.Resources) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover to READY within 90 s of killing instance %d: primary %d, %+v", primary, now, got)
		}
	}
	check("after failover")
}
