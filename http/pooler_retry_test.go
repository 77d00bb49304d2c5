package http_test

import "testing"

// TestPooler_AskedAgainWhileApplying: enablePooler asked again while the
// first ask's operation still runs (a client retrying after dbcloud
// stopped before answering) is answered as the first ask was, not refused
// with OPERATION_IN_PROGRESS for its own operation.
func TestPooler_AskedAgainWhileApplying(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		s := e.readyService(map[string]any{"name": "p"})
		enable := e.pa() + "/services/" + s.ServiceID + "/enablePooler"
		e.want(200, "", req{Method: "POST", Path: enable})
		// Nothing settles the operation here: it is still pending.
		e.want(200, "", req{Method: "POST", Path: enable, Header: map[string]string{"Idempotency-Key": "retry-1"}})
		e.want(200, "", req{Method: "POST", Path: enable})
		// Another change is still refused while it applies.
		e.want(409, "OPERATION_IN_PROGRESS", req{Method: "POST", Path: e.pa() + "/services/" + s.ServiceID + "/setHA", Body: map[string]any{"replica_count": 1}})
	})
}
