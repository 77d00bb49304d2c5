package http_test

import (
	"strings"
	"testing"

	"dbcloud/sizing"

	"dbcloud"
)

// TestAdmission_Disk: a create, a fork or a resize whose storage limit the
// disk cannot still give (free space less the reserve) is refused with
// 409 CAPACITY_EXCEEDED saying what is free, and nothing is made; a
// change that fits passes, and so do a shrink and a start (the limit does
// not grow) on a disk that others filled meanwhile. The disk has 40 GiB
// free, 4 of them reserved; a shared service may keep 10 GiB, a dedicated
// one 10 GiB per GiB of memory.
func TestAdmission_Disk(t *testing.T) {
	limits := sizing.StorageLimits{SharedMiB: 10 << 10, MiBPerMemoryGiB: 10 << 10}
	e := newEnv(t, "sqlite", noLimits)
	a := e.readyService(map[string]any{"name": "a", "cpu_millis": "shared"})
	e.runtime.mu.Lock()
	e.runtime.host = &dbcloud.HostCapacity{CPUMillis: 64000, MemoryBytes: 256 << 30, Overcommit: 1,
		DiskFreeBytes: 40 << 30, DiskReserveBytes: 4 << 30, StorageLimit: limits.Of}
	e.runtime.mu.Unlock()
	refused := func(name, free string, r req) {
		t.Helper()
		before := e.do(req{Method: "GET", Path: e.pa() + "/services"}).Body
		var body struct{ Message string }
		e.want(409, dbcloud.CodeCapacityExceeded, r).decode(t, &body)
		t.Logf("%s: %s", name, body.Message)
		if !strings.Contains(body.Message, "disk") || !strings.Contains(body.Message, free+" is free to give") {
			t.Errorf("%s: the refusal does not say the disk has %s to give: %q", name, free, body.Message)
		}
		if after := e.do(req{Method: "GET", Path: e.pa() + "/services"}).Body; string(before) != string(after) {
			t.Errorf("%s: the refused request changed the services", name)
		}
	}
	path := e.pa() + "/services/" + a.ServiceID
	// 4 GiB of memory may keep 40 GiB: more than the 36 the disk gives.
	big := map[string]any{"cpu_millis": "1000", "memory_gbs": "4"}
	refused("Create", "36 GiB", req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "b", "cpu_millis": "1000", "memory_gbs": "4"}})
	refused("Fork", "36 GiB", req{Method: "POST", Path: path + "/forkService", Body: map[string]any{"fork_strategy": "LAST_SNAPSHOT", "cpu_millis": "1000", "memory_gbs": "4"}})
	refused("Resize", "36 GiB", req{Method: "POST", Path: path + "/resize", Body: big})

	// 2 GiB keeps 20 GiB: it fits.
	e.want(202, "", req{Method: "POST", Path: path + "/resize", Body: map[string]string{"cpu_millis": "500", "memory_gbs": "2"}})
	e.settle(a.ServiceID, dbcloud.StatusReady)

	// Others filled the disk meanwhile: growing is refused, starting
	// and shrinking are not.
	e.runtime.mu.Lock()
	e.runtime.host.DiskFreeBytes = 10 << 30
	e.runtime.mu.Unlock()
	refused("ResizeOnFullerDisk", "6 GiB", req{Method: "POST", Path: path + "/resize", Body: big})
	e.want(202, "", req{Method: "POST", Path: path + "/stop"})
	e.settle(a.ServiceID, dbcloud.StatusPaused)
	e.want(202, "", req{Method: "POST", Path: path + "/start"})
	e.settle(a.ServiceID, dbcloud.StatusReady)
	e.want(202, "", req{Method: "POST", Path: path + "/resize", Body: map[string]string{"cpu_millis": "shared", "memory_gbs": "shared"}})
	e.settle(a.ServiceID, dbcloud.StatusReady)
}
