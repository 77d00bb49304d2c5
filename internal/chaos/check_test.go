package chaos

import (
	"strings"
	"testing"
)

// fixture is a model and a world that agree: two live services (one READY
// with a pooler and a VPC, one PAUSED at the small size), one deleted
// service that left nothing behind, and a renamed VPC.
func fixture() (*Model, *World) {
	m := NewModel()
	m.Add(&Service{ID: "a", Running: true, Size: Shared, Env: "PROD", Pooler: true, VPC: "7",
		Passwords: []string{"pw-a"}, Rows: map[int64]string{1: RowPayload(9, 1), 2: RowPayload(9, 2)}})
	m.Add(&Service{ID: "b", Running: false, Size: Small, Env: "DEV", Passwords: []string{"pw-b"},
		Rows: map[int64]string{3: RowPayload(9, 3)}})
	m.Add(&Service{ID: "gone", Deleted: true, Size: Shared, Env: "DEV"})
	m.VPCs["7"] = "renamed"

	a := apiService("a", "READY", "PROD", Shared, 1)
	a.ConnectionPooler = &struct {
		Endpoint *Endpoint `json:"endpoint"`
	}{&Endpoint{"127.0.0.1", 31001}}
	a.VPCEndpoint = &struct {
		Endpoint
		VPCID string `json:"vpc_id"`
	}{Endpoint{"127.77.0.1", 31000}, "7"}
	b := apiService("b", "PAUSED", "DEV", Small, 1)
	b.Endpoint.Port = 31002
	w := &World{
		API:  map[string]APIService{"a": a, "b": b},
		VPCs: map[string]string{"7": "renamed"},
		Operations: []Operation{
			{ID: "op1", ResourceID: "a", Type: "create_service", State: "succeeded"},
			{ID: "op2", ResourceID: "gone", Type: "delete_service", State: "succeeded"},
			{ID: "op3", ResourceID: "b", Type: "resize_service", State: "superseded"},
		},
		Ports: map[int]string{31000: "a", 31001: "a", 31002: "b"},
		Processes: []Process{
			{PID: 10, Kind: Postmaster, ServiceID: "a", Instance: "0", Listens: []string{"127.0.0.1:31000"}},
			{PID: 11, Kind: Pooler, ServiceID: "a", Listens: []string{"127.0.0.1:31001"}},
		},
		Dirs:    []string{"a", "b"},
		Cgroups: []string{"a-0", "a-pooler", "b-0"},
		Logins: map[string][]Login{"a": {
			{Via: "endpoint", SharedBuffers: "16MB", Rows: map[int64]string{1: RowPayload(9, 1), 2: RowPayload(9, 2), 5: "extra"}},
			{Via: "pooler"},
			{Via: "vpc"},
		}},
	}
	return m, w
}

func apiService(id, status, env string, size Size, resources int) APIService {
	var a APIService
	a.ServiceID, a.Status, a.Metadata.Environment = id, status, env
	a.Endpoint = &Endpoint{"127.0.0.1", 31000}
	for range resources {
		var r struct {
			ID   string `json:"id"`
			Spec struct {
				CPUMillis *int `json:"cpu_millis"`
				MemoryGBs *int `json:"memory_gbs"`
			} `json:"spec"`
		}
		if size != Shared {
			cpu, mem := 500, 2
			r.Spec.CPUMillis, r.Spec.MemoryGBs = &cpu, &mem
		}
		a.Resources = append(a.Resources, r)
	}
	return a
}

func TestCheck_AgreeingWorld(t *testing.T) {
	m, w := fixture()
	if got := Check(m, w); len(got) != 0 {
		t.Fatalf("violations in an agreeing world: %v", got)
	}
}

// TestCheck_Violations breaks the agreeing world in one way per case and
// wants exactly the violation that way stands for.
func TestCheck_Violations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(m *Model, w *World)
		want   Invariant
		text   string
	}{
		// Every accepted operation finishes.
		{"StopNotFinished", func(m *Model, w *World) {
			a := w.API["b"]
			a.Status = "PAUSING"
			w.API["b"] = a
		}, Finished, "status PAUSING, want PAUSED"},
		{"OperationPending", func(m *Model, w *World) {
			w.Operations = append(w.Operations, Operation{ID: "op9", ResourceID: "a", Type: "stop_service", State: "pending"})
		}, Finished, "op9 (stop_service) is still pending"},
		{"OperationFailed", func(m *Model, w *World) {
			w.Operations[0].State, w.Operations[0].Error = "failed", "boom"
		}, Finished, "failed: boom"},
		{"DeleteNotFinished", func(m *Model, w *World) {
			w.API["gone"] = apiService("gone", "DELETING", "DEV", Shared, 1)
			w.Ports[31009] = "gone"
		}, Finished, "delete was accepted"},
		{"CreateLost", func(m *Model, w *World) {
			delete(w.API, "b")
			delete(w.Ports, 31002)
			w.Dirs = w.Dirs[:1]
			w.Cgroups = w.Cgroups[:2]
		}, Finished, "is not listed"},
		{"UnknownService", func(m *Model, w *World) {
			w.API["dup"] = apiService("dup", "READY", "DEV", Shared, 1)
		}, Finished, "no accepted request created it"},
		{"ResizeNotInAPI", func(m *Model, w *World) { m.Services["b"].Size = Shared }, Finished, "size 500/2, want shared"},
		{"ResizeNotInPostgreSQL", func(m *Model, w *World) { w.Logins["a"][0].SharedBuffers = "512MB" }, Finished, "shared_buffers is 512MB, want 16MB"},
		{"RenameLost", func(m *Model, w *World) { w.VPCs["7"] = "old" }, Finished, `named "old", want "renamed"`},
		{"PoolerEndpointMissing", func(m *Model, w *World) {
			a := w.API["a"]
			a.ConnectionPooler.Endpoint = nil
			w.API["a"] = a
		}, Finished, "no pooler endpoint"},
		{"DetachNotFinished", func(m *Model, w *World) { m.Services["a"].VPC = "" }, Finished, "detached, but vpcEndpoint"},

		// No orphan process, directory, port or cgroup.
		{"OrphanPostmaster", func(m *Model, w *World) {
			w.Processes = append(w.Processes, Process{PID: 99, Kind: Postmaster, ServiceID: "gone", Instance: "0", Listens: []string{"127.0.0.1:31005"}})
		}, NoOrphans, "postmaster pid 99 runs for a service the store does not have, listening on 127.0.0.1:31005"},
		{"OrphanProxy", func(m *Model, w *World) {
			w.Processes = append(w.Processes, Process{PID: 98, Kind: Proxy, ServiceID: "unknown"})
		}, NoOrphans, "proxy pid 98"},
		{"OrphanDirectory", func(m *Model, w *World) { w.Dirs = append(w.Dirs, "gone") }, NoOrphans, "directory services/gone remains"},
		{"OrphanPort", func(m *Model, w *World) { w.Ports[31003] = "gone" }, NoOrphans, "port 31003 is still claimed"},
		{"OrphanCgroup", func(m *Model, w *World) { w.Cgroups = append(w.Cgroups, "gone-1") }, NoOrphans, "cgroup dbcloud/gone-1 remains"},

		// The store agrees with what runs.
		{"ReadyWithoutPostmaster", func(m *Model, w *World) { w.Processes = w.Processes[1:] }, Agrees, "but 0 postmasters run"},
		{"PausedWithPostmaster", func(m *Model, w *World) {
			w.Processes = append(w.Processes, Process{PID: 20, Kind: Postmaster, ServiceID: "b", Instance: "0"})
		}, Agrees, "PAUSED, yet 1 postmasters"},
		{"TwoPostmastersOneInstance", func(m *Model, w *World) {
			w.Processes = append(w.Processes, Process{PID: 21, Kind: Postmaster, ServiceID: "a", Instance: "0"})
		}, Agrees, "instance 0 has 2 postmasters"},
		{"PoolerNotRunning", func(m *Model, w *World) { w.Processes = w.Processes[:1] }, Agrees, "0 PgBouncers run"},
		{"PasswordRefused", func(m *Model, w *World) {
			w.Logins["a"][0].Err = "password authentication failed"
		}, Agrees, "via the endpoint with its password failed"},
		{"VPCLoginRefused", func(m *Model, w *World) { w.Logins["a"][2].Err = "connection refused" }, Agrees, "via the vpc"},
		{"InstanceCount", func(m *Model, w *World) {
			a := w.API["a"]
			a.Resources = append(a.Resources, a.Resources[0])
			w.API["a"] = a
		}, Agrees, "2 resources listed, want 1"},
		{"EndpointNotClaimed", func(m *Model, w *World) { delete(w.Ports, 31002) }, Agrees, "endpoint port 31002 is not claimed"},

		// Acknowledged data is intact.
		{"RowMissing", func(m *Model, w *World) { delete(w.Logins["a"][0].Rows, 2) }, DataIntact, "1 of 2 acknowledged rows missing: 2"},
		{"RowChanged", func(m *Model, w *World) { w.Logins["a"][0].Rows[1] = "other" }, DataIntact, "other content: 1"},
		{"TableGone", func(m *Model, w *World) {
			w.Logins["a"][0].Rows, w.Logins["a"][0].RowsErr = nil, "the table chaos_rows does not exist"
		}, DataIntact, "cannot be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, w := fixture()
			tc.mutate(m, w)
			got := Check(m, w)
			if len(got) == 0 {
				t.Fatalf("no violation, want %s %q", tc.want, tc.text)
			}
			for _, v := range got {
				if v.Invariant == tc.want && strings.Contains(v.Detail, tc.text) {
					return
				}
			}
			t.Errorf("violations %v, want %s %q", got, tc.want, tc.text)
		})
	}
}
