package local

import (
	"os"
	"path/filepath"
	"testing"

	"dbcloud"
)

// TestLogicalAtStart: a stopped service on an older version than the
// host's newest starts writing logical WAL, marked so; one on the newest
// version (upgraded since) starts without it, its mark gone.
func TestLogicalAtStart(t *testing.T) {
	rt := versionsRuntime(t)
	for _, c := range []struct {
		version     int
		marked      bool
		wantMark    bool
		wantLogical bool
		what        string
	}{
		{15, false, true, true, "on 15, never marked"},
		{15, true, true, true, "on 15, marked"},
		{17, true, false, false, "on 17, marked before its upgrade"},
		{17, false, false, false, "on 17, never marked"},
	} {
		svc := &dbcloud.Service{ID: "walmark", Spec: dbcloud.ServiceSpec{Size: dbcloud.Size{Shared: true}, Running: true, PGVersion: c.version},
			Endpoint: &dbcloud.Endpoint{Host: "127.0.0.1", Port: 1}}
		dir := rt.serviceDir(svc.ID)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		mark := filepath.Join(dir, logicalWALFile)
		os.Remove(mark)
		if c.marked {
			if err := rt.markLogicalWAL(svc.ID); err != nil {
				t.Fatal(err)
			}
		}
		base, err := rt.instanceBase(svc)
		if err != nil {
			t.Fatal(err)
		}
		if err := rt.logicalAtStart(svc, &base); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if got, logical := rt.logicalWAL(svc.ID), base.Settings["wal_level"] == "logical"; got != c.wantMark || logical != c.wantLogical {
			t.Errorf("%s: marked %v, wal_level logical %v; want %v, %v", c.what, got, logical, c.wantMark, c.wantLogical)
		}
	}
}
