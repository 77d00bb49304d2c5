package http_test

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"dbcloud/cloud"
	"dbcloud/history"

	"dbcloud"
	"dbcloud/http"
	"dbcloud/identity"
	"dbcloud/postgres"
)

// secondPlane returns another control plane on e's PostgreSQL store, as a
// second dbcloud serve has it: its own store handle (connection pool),
// Cloud, caches and HTTPS server. Requests to it go through the returned
// env; e stays the first plane.
func (e *env) secondPlane(t *testing.T) *env {
	t.Helper()
	s, err := postgres.Open(context.Background(), e.dsn)
	if err != nil {
		t.Fatalf("open the store again: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := *e
	b.t, b.store = t, s
	b.cloud = cloud.New(history.NewEventStore(s), e.runtime, cloud.DefaultConfig(), logger)
	b.srv = httptest.NewUnstartedServer(http.NewHandler(b.cloud, noLimits, logger))
	b.srv.StartTLS()
	t.Cleanup(b.srv.Close)
	_, b.router = loadContract(t, b.srv.URL+http.BasePath)
	return &b
}

// names lists the names of project a's services, as GET services shows them.
func (e *env) names() map[string]string {
	e.t.Helper()
	var list []service
	e.want(200, "", req{Method: "GET", Path: e.pa() + "/services"}).decode(e.t, &list)
	out := map[string]string{}
	for _, s := range list {
		out[s.ServiceID] = s.Name
	}
	return out
}

// TestReadCache_TwoPlanes: each plane keeps the credentials it verified and
// the services it encoded, and a write acknowledged by one plane is seen
// by the very next request on either plane, asked once, never polled: a
// rename, a status the engine wrote, a key revoked, a user's tokens
// revoked by signing out, a role lowered.
func TestReadCache_TwoPlanes(t *testing.T) {
	ctx := context.Background()
	a := newEnv(t, "postgres", noLimits)
	b := a.secondPlane(t)
	s := a.readyService(map[string]any{"name": "before"})
	key, err := a.cloud.CreateAPIKey(ctx, a.a.ProjectID, "second key", "admin", "admin@example.com")
	if err != nil {
		t.Fatal(err)
	}
	callers := roleCallers(t, a)
	owner := callers[0]
	svcPath := a.pa() + "/services/" + s.ServiceID
	// Both planes read, and so keep, everything the subtests change.
	keyRevoked := false
	warm := func(t *testing.T) {
		t.Helper()
		for _, p := range []*env{a.with(t), b.with(t)} {
			p.getService(s.ServiceID)
			p.names()
			if !keyRevoked {
				p.want(200, "", req{Method: "GET", Path: svcPath, Key: key})
			}
			p.want(200, "", req{Method: "GET", Path: svcPath, Bearer: owner.token})
		}
	}

	t.Run("Rename", func(t *testing.T) {
		warm(t)
		a.with(t).want(200, "", req{Method: "POST", Path: svcPath + "/rename", Body: map[string]any{"name": "after"}})
		if got := a.with(t).getService(s.ServiceID).Name; got != "after" {
			t.Errorf("GET on the plane that renamed: name %q, want after", got)
		}
		if got := b.with(t).getService(s.ServiceID).Name; got != "after" {
			t.Errorf("GET on the other plane after a rename: name %q, want after", got)
		}
		if got := b.with(t).names()[s.ServiceID]; got != "after" {
			t.Errorf("list on the other plane after a rename: name %q, want after", got)
		}
	})
	t.Run("EngineWrite", func(t *testing.T) {
		warm(t)
		// The engine writes through the store, not through Cloud.
		a.with(t).settle(s.ServiceID, dbcloud.StatusPaused)
		if got := b.with(t).getService(s.ServiceID).Status; got != string(dbcloud.StatusPaused) {
			t.Errorf("GET on the other plane after the engine's write: status %q, want PAUSED", got)
		}
	})
	t.Run("KeyRevoked", func(t *testing.T) {
		warm(t)
		if err := a.cloud.RevokeAPIKey(ctx, key.AccessKey); err != nil {
			t.Fatal(err)
		}
		keyRevoked = true
		a.with(t).want(401, "UNAUTHORIZED", req{Method: "GET", Path: svcPath, Key: key})
		b.with(t).want(401, "UNAUTHORIZED", req{Method: "GET", Path: svcPath, Key: key})
		b.with(t).want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", Key: key})
		// The other key is unaffected.
		b.with(t).want(200, "", req{Method: "GET", Path: svcPath})
	})
	t.Run("RoleLowered", func(t *testing.T) {
		warm(t)
		rename := map[string]any{"name": "by-owner"}
		b.with(t).want(200, "", req{Method: "POST", Path: svcPath + "/rename", Body: rename, Bearer: owner.token})
		boot, err := a.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, userToken(t, a, bootstrapUser(t, a)))
		if err != nil {
			t.Fatal(err)
		}
		p, err := a.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, owner.token)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.cloud.SetMember(cloud.NewContextWithPrincipal(ctx, boot), a.a.ProjectID, p.User.Email, identity.Viewer); err != nil {
			t.Fatal(err)
		}
		b.with(t).want(403, "FORBIDDEN", req{Method: "POST", Path: svcPath + "/rename", Body: rename, Bearer: owner.token})
		b.with(t).want(200, "", req{Method: "GET", Path: svcPath, Bearer: owner.token})
	})
	t.Run("SignedOut", func(t *testing.T) {
		warm(t)
		a.with(t).want(204, "", req{Method: "POST", Path: "/auth/logout", Bearer: owner.token})
		a.with(t).want(401, "UNAUTHORIZED", req{Method: "GET", Path: svcPath, Bearer: owner.token})
		b.with(t).want(401, "UNAUTHORIZED", req{Method: "GET", Path: svcPath, Bearer: owner.token})
		b.with(t).want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", Bearer: owner.token})
	})
}

// TestReadCache_ReadYourWrites: on each store, every change a client makes
// is in its next GET and list, though both were answered from the cache
// just before; and a service another client deletes is gone.
func TestReadCache_ReadYourWrites(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind, noLimits)
			s := e.readyService(map[string]any{"name": "v0"})
			other := e.readyService(map[string]any{"name": "other"})
			path := e.pa() + "/services/" + s.ServiceID
			for i := 1; i <= 5; i++ {
				// Twice each, so the second answer comes from the cache.
				e.getService(s.ServiceID)
				e.names()
				name := "v" + string(rune('0'+i))
				e.want(200, "", req{Method: "POST", Path: path + "/rename", Body: map[string]any{"name": name}})
				if got := e.getService(s.ServiceID).Name; got != name {
					t.Fatalf("GET after rename %d: name %q, want %q", i, got, name)
				}
				if got := e.names()[s.ServiceID]; got != name {
					t.Fatalf("list after rename %d: name %q, want %q", i, got, name)
				}
			}
			e.want(200, "", req{Method: "POST", Path: path + "/setEnvironment", Body: map[string]any{"environment": "DEV"}})
			if got := e.getService(s.ServiceID).Metadata.Environment; got != "DEV" {
				t.Errorf("GET after setEnvironment: %q, want DEV", got)
			}
			e.want(202, "", req{Method: "DELETE", Path: e.pa() + "/services/" + other.ServiceID})
			e.settle(other.ServiceID, dbcloud.StatusDeleted)
			if err := e.store.Update(context.Background(), func(tx dbcloud.Tx) error {
				return tx.DeleteService(e.a.ProjectID, other.ServiceID)
			}); err != nil {
				t.Fatal(err)
			}
			e.want(404, "", req{Method: "GET", Path: e.pa() + "/services/" + other.ServiceID})
			if _, ok := e.names()[other.ServiceID]; ok {
				t.Errorf("list after delete still shows %s", other.ServiceID)
			}
		})
	}
}

// TestReadCache_OwnCounter: a service's answer is kept under its own
// counter, so writes to the project's other services (as the engine
// writes each running service's usage every few seconds) do not make
// every GET of an idle one read the store again; the list, made of all of
// them, is read again. To tell a kept answer from a fresh one, the test
// changes the service's row behind the store's counters.
func TestReadCache_OwnCounter(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	a := e.readyService(map[string]any{"name": "a"})
	b := e.readyService(map[string]any{"name": "b"})
	e.getService(a.ServiceID) // kept
	db, err := sql.Open("sqlite", e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE services SET doc = json_set(doc, '$.name', 'behind') WHERE id = ?`, a.ServiceID); err != nil {
		t.Fatal(err)
	}
	e.want(200, "", req{Method: "POST", Path: e.pa() + "/services/" + b.ServiceID + "/rename", Body: map[string]any{"name": "b2"}})
	if got := e.getService(a.ServiceID).Name; got != "a" {
		t.Errorf("GET of a after a write to b: name %q, want the kept answer's \"a\"", got)
	}
	if got := e.getService(b.ServiceID).Name; got != "b2" {
		t.Errorf("GET of b after its rename: name %q, want \"b2\"", got)
	}
	if got := e.names(); got[a.ServiceID] != "behind" || got[b.ServiceID] != "b2" {
		t.Errorf("list after a write to b: names %v, want it read again (a \"behind\", b \"b2\")", got)
	}
	e.want(200, "", req{Method: "POST", Path: e.pa() + "/services/" + a.ServiceID + "/rename", Body: map[string]any{"name": "a2"}})
	if got := e.getService(a.ServiceID).Name; got != "a2" {
		t.Errorf("GET of a after its rename: name %q, want \"a2\"", got)
	}
}

// TestReadCache_TokenExpiry: a token kept verified still expires on time,
// though nothing in the store changed.
func TestReadCache_TokenExpiry(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	tok := userToken(t, e, bootstrapUser(t, e)) // valid for an hour
	path := e.pa() + "/services"
	e.want(200, "", req{Method: "GET", Path: path, Bearer: tok})
	e.want(200, "", req{Method: "GET", Path: path, Bearer: tok}) // from the cache
	later := time.Now().Add(2 * time.Hour)
	e.cloud.Now = func() time.Time { return later }
	e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: path, Bearer: tok})
}
