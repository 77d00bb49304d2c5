package http_test

import (
	"strings"
	"testing"
)

// TestPGVersion: a create chooses one of the installation's PostgreSQL
// versions (the test runtime has 15 and 17), the newest when it names
// none; another is 400 naming those there are; a fork runs its parent's
// version, and naming another is 400 (decisions.md section 11).
func TestPGVersion(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	version := func(what string, s service, major int, full string) {
		t.Helper()
		if s.Metadata.PGVersion != major || s.Metadata.PGVersionFull != full {
			t.Errorf("%s: metadata pg_version %d, pg_version_full %q; want %d, %q",
				what, s.Metadata.PGVersion, s.Metadata.PGVersionFull, major, full)
		}
	}
	version("create without pg_version", e.createService(map[string]any{"name": "newest"}), 17, "17.12")
	old := e.readyService(map[string]any{"name": "old", "pg_version": 15})
	version("create with 15", old, 15, "15.20")
	version("GET of the 15", e.getService(old.ServiceID), 15, "15.20")

	for _, body := range []map[string]any{
		{"name": "x", "pg_version": 16},
		{"name": "x", "pg_version": 0},
		{"name": "x", "pg_version": -17},
	} {
		res := e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: e.pa() + "/services", Body: body})
		if !strings.Contains(string(res.Body), "15, 17") {
			t.Errorf("create with %v: the 400 does not list the versions: %s", body["pg_version"], res.Body)
		}
	}
	e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: e.pa() + "/services", Body: `{"name": "x", "pg_version": "17"}`})

	fork := e.pa() + "/services/" + old.ServiceID + "/forkService"
	var f service
	e.want(202, "", req{Method: "POST", Path: fork, Body: map[string]any{"fork_strategy": "LAST_SNAPSHOT"}}).decode(t, &f)
	version("fork of the 15", f, 15, "15.20")
	e.want(202, "", req{Method: "POST", Path: fork, Body: map[string]any{"fork_strategy": "LAST_SNAPSHOT", "pg_version": 15}}).decode(t, &f)
	version("fork naming its parent's version", f, 15, "15.20")
	res := e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: fork, Body: map[string]any{"fork_strategy": "LAST_SNAPSHOT", "pg_version": 17}})
	if !strings.Contains(string(res.Body), "upgrade") {
		t.Errorf("fork on another version: the 400 does not say what to do instead: %s", res.Body)
	}
}
