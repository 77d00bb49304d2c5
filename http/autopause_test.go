package http_test

import (
	"testing"

	"dbcloud"
)

// TestSetAutoPause: idle_seconds is 0 (off) or 60..604800, the answer is
// 200 with auto_pause (absent when off), and auto-pause excludes HA
// replicas and read replica sets both ways (decisions.md section 10).
func TestSetAutoPause(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		type withAutoPause struct {
			Status    string `json:"status"`
			AutoPause *struct {
				IdleSeconds int `json:"idle_seconds"`
			} `json:"auto_pause"`
		}
		s := e.readyService(map[string]any{"name": "idle", "environment_tag": "PROD"})
		path := e.pa() + "/services/" + s.ServiceID
		for _, bad := range []any{59, 604801, -1, "60", 1.5} {
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path + "/setAutoPause", Body: map[string]any{"idle_seconds": bad}})
		}
		e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path + "/setAutoPause", Body: map[string]any{}})
		for _, n := range []int{60, 604800} {
			var got withAutoPause
			e.want(200, "", req{Method: "POST", Path: path + "/setAutoPause", Body: map[string]any{"idle_seconds": n}}).decode(t, &got)
			if got.AutoPause == nil || got.AutoPause.IdleSeconds != n || got.Status != "READY" {
				t.Errorf("setAutoPause %d answered %+v", n, got)
			}
		}
		// On: HA and read replica sets are refused until it is off.
		e.want(409, "CONFLICT", req{Method: "POST", Path: path + "/setHA", Body: map[string]any{"replica_count": 1}})
		e.want(409, "CONFLICT", req{Method: "POST", Path: path + "/replicaSets", Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}})
		var off withAutoPause
		e.want(200, "", req{Method: "POST", Path: path + "/setAutoPause", Body: map[string]any{"idle_seconds": 0}}).decode(t, &off)
		if off.AutoPause != nil {
			t.Errorf("setAutoPause 0 left auto_pause %+v", off.AutoPause)
		}
		var got withAutoPause
		e.want(200, "", req{Method: "GET", Path: path}).decode(t, &got)
		if got.AutoPause != nil {
			t.Errorf("GET after setAutoPause 0: auto_pause %+v", got.AutoPause)
		}
		// With HA replicas, or a read replica set, auto-pause is refused.
		e.want(202, "", req{Method: "POST", Path: path + "/setHA", Body: map[string]any{"replica_count": 1}})
		e.settle(s.ServiceID, dbcloud.StatusReady)
		e.want(409, "CONFLICT", req{Method: "POST", Path: path + "/setAutoPause", Body: map[string]any{"idle_seconds": 60}})
		other := e.readyService(map[string]any{"name": "reads", "environment_tag": "PROD"})
		opath := e.pa() + "/services/" + other.ServiceID
		var set struct{ ID string }
		e.want(202, "", req{Method: "POST", Path: opath + "/replicaSets", Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}}).decode(t, &set)
		e.want(409, "CONFLICT", req{Method: "POST", Path: opath + "/setAutoPause", Body: map[string]any{"idle_seconds": 60}})
	})
}
