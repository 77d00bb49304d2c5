package http_test

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestServices_ConcurrentCreates: creates sent at once all succeed, each
// with its own port. Before candidates were probed from a random place,
// every request probed the same lowest free ports and some lost the race
// for all of them on every retry, answered 500 and made nothing.
func TestServices_ConcurrentCreates(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		// A probe as slow as a loaded host's: the requests probe together
		// and then race for what they probed.
		e.runtime.portFree = func(int) bool { time.Sleep(5 * time.Millisecond); return true }
		const n = 36 // under the default instance quota of 40
		var wg sync.WaitGroup
		results := make([]*resp, n)
		for i := range n {
			wg.Go(func() {
				results[i] = e.do(req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": fmt.Sprintf("c%d", i), "cpu_millis": "shared"}})
			})
		}
		wg.Wait()
		ports := map[int]string{}
		for i, r := range results {
			if r.Status != 202 {
				t.Errorf("create %d: %d %s", i, r.Status, r.Body)
				continue
			}
			var s service
			r.decode(t, &s)
			if other, dup := ports[s.Endpoint.Port]; dup {
				t.Errorf("services %s and %s share port %d", other, s.ServiceID, s.Endpoint.Port)
			}
			ports[s.Endpoint.Port] = s.ServiceID
		}
	})
}
