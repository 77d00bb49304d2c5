package http_test

import "testing"

// TestNames_Trimmed: every client gets one naming rule from the domain:
// white space around a name is dropped, and a name with no visible
// character is refused, by create and by rename alike (a rename to
// spaces used to answer 200 and leave an invisible link in lists).
func TestNames_Trimmed(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	s := e.readyService(map[string]any{"name": "  shop  "})
	if got := e.getService(s.ServiceID); got.Name != "shop" {
		t.Errorf("created as %q, want \"shop\"", got.Name)
	}
	path := e.pa() + "/services/" + s.ServiceID + "/rename"
	e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path, Body: map[string]string{"name": "   "}})
	e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "\u00a0\u3000"}})
	if got := e.getService(s.ServiceID); got.Name != "shop" {
		t.Errorf("after the refused rename: %q", got.Name)
	}
	e.want(200, "", req{Method: "POST", Path: path, Body: map[string]string{"name": " shop 2 "}})
	if got := e.getService(s.ServiceID); got.Name != "shop 2" {
		t.Errorf("renamed to %q, want \"shop 2\"", got.Name)
	}
}
