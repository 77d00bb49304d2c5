package http_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/http"
	"dbcloud/identity"
)

// caller is one credential of the role matrix: a key or a user's token.
type caller struct {
	name  string
	role  identity.Role
	key   *cloud.NewAPIKey
	token string
}

func (c caller) req(r req) req {
	r.Key, r.Bearer = c.key, c.token
	return r
}

// roleCallers makes, in project a, a user of each role with an OAuth
// access token, and a key of each role issued by the owner.
func roleCallers(t *testing.T, e *env) []caller {
	t.Helper()
	ctx := context.Background()
	e.cloud.PasswordParams = &identity.PasswordParams{Time: 1, Memory: 1024, Threads: 1}
	var out []caller
	var owner *dbcloud.Principal
	for _, role := range []identity.Role{identity.Owner, identity.Admin, identity.Developer, identity.Viewer} {
		u, _, err := e.cloud.CreateUser(ctx, cloud.NewUser{
			Email: string(role) + "-user@example.com", Name: string(role), ProjectID: e.a.ProjectID, Role: role,
		})
		if err != nil {
			t.Fatal(err)
		}
		tok := userToken(t, e, u.ID)
		out = append(out, caller{name: "user " + string(role), role: role, token: tok})
		if role == identity.Owner {
			if owner, err = e.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, tok); err != nil {
				t.Fatal(err)
			}
		}
	}
	octx := cloud.NewContextWithPrincipal(ctx, owner)
	for _, role := range identity.Roles {
		k, err := e.cloud.IssueAPIKey(octx, e.a.ProjectID, string(role)+" key", role)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, caller{name: "key " + string(role), role: role, key: k})
	}
	return out
}

// userToken issues an OAuth access token for the user, as the token
// endpoint would.
func userToken(t *testing.T, e *env, userID string) string {
	t.Helper()
	var tok string
	err := e.store.Update(context.Background(), func(tx dbcloud.Tx) (err error) {
		tok, err = e.cloud.IssueUserToken(tx, &dbcloud.UserToken{Kind: dbcloud.TokenAccess, UserID: userID}, time.Hour)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// matrixBodies are valid bodies for the operations that read one, keyed by
// the last segment of the path, so that a refusal can only be the role's.
var matrixBodies = map[string]any{
	"vpcs":           map[string]any{"name": "v", "cidr": "10.9.0.0/16", "region_code": "local"},
	"rename":         map[string]any{"name": "renamed"},
	"peerings":       map[string]any{"peer_account_id": "acc", "peer_region_code": "local", "peer_vpc_id": "vpc-1"},
	"services":       map[string]any{"name": "matrix"},
	"attachToVPC":    map[string]any{"vpc_id": "0"},
	"detachFromVPC":  map[string]any{"vpc_id": "0"},
	"resize":         map[string]any{"cpu_millis": "500", "memory_gbs": "2"},
	"upgrade":        map[string]any{"pg_version": 17},
	"forkService":    map[string]any{"fork_strategy": "NOW"},
	"updatePassword": map[string]any{"password": "a-long-enough-password"},
	"setEnvironment": map[string]any{"environment": "DEV"},
	"setHA":          map[string]any{"replica_count": 0},
	"setAutoPause":   map[string]any{"idle_seconds": 0},
	"replicaSets":    map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1},
	"credentials":    map[string]any{"name": "reader", "access": "READ_ONLY", "ttl_seconds": 600},
	"series":         map[string]any{"name": dbcloud.SeriesConnections, "from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:00:00Z"},
}

// roleActions is the role table written out, not read from identity: a
// table broken there (a viewer given ChangeResources) must fail here too,
// both against identity's answers and against the API's.
var roleActions = map[identity.Role]map[identity.Action]bool{
	identity.Viewer: {identity.Read: true, identity.MintReadOnly: true, identity.ChangeResources: false,
		identity.ManageKeys: false, identity.ManageMembers: false, identity.DeleteProject: false},
	identity.Developer: {identity.Read: true, identity.MintReadOnly: true, identity.ChangeResources: true,
		identity.ManageKeys: false, identity.ManageMembers: false, identity.DeleteProject: false},
	identity.Admin: {identity.Read: true, identity.MintReadOnly: true, identity.ChangeResources: true,
		identity.ManageKeys: true, identity.ManageMembers: true, identity.DeleteProject: false},
	identity.Owner: {identity.Read: true, identity.MintReadOnly: true, identity.ChangeResources: true,
		identity.ManageKeys: true, identity.ManageMembers: true, identity.DeleteProject: true},
}

// routeClass is what a route of the API asks of the caller's role.
type routeClass string

const (
	readsProject   routeClass = "reads the project"
	mintsReadOnly  routeClass = "makes or revokes a READ_ONLY database credential"
	changesProject routeClass = "changes the project's resources"
)

// roleRoutes is the answer each role must get from each class of route,
// written out: every role reads and mints READ_ONLY credentials,
// developers and above change resources.
var roleRoutes = map[identity.Role]map[routeClass]bool{
	identity.Viewer:    {readsProject: true, mintsReadOnly: true, changesProject: false},
	identity.Developer: {readsProject: true, mintsReadOnly: true, changesProject: true},
	identity.Admin:     {readsProject: true, mintsReadOnly: true, changesProject: true},
	identity.Owner:     {readsProject: true, mintsReadOnly: true, changesProject: true},
}

// checkIdentityTable: identity's role table answers as roleActions says,
// for every role and action it knows, and roleRoutes agrees with both.
func checkIdentityTable(t *testing.T) {
	t.Helper()
	if len(identity.Roles) != len(roleActions) {
		t.Errorf("identity has %d roles, the written table %d", len(identity.Roles), len(roleActions))
	}
	for _, r := range identity.Roles {
		want, ok := roleActions[r]
		if !ok {
			t.Errorf("role %s is not in the written table", r)
			continue
		}
		if len(identity.Actions) != len(want) {
			t.Errorf("identity has %d actions, the written table %d for %s", len(identity.Actions), len(want), r)
		}
		for _, a := range identity.Actions {
			if got := r.Allows(a); got != want[a] {
				t.Errorf("identity: %s allows %s = %v, want %v", r, a, got, want[a])
			}
		}
	}
	classAction := map[routeClass]identity.Action{readsProject: identity.Read, mintsReadOnly: identity.MintReadOnly, changesProject: identity.ChangeResources}
	for r, classes := range roleRoutes {
		for class, want := range classes {
			if a := classAction[class]; roleActions[r][a] != want || r.Allows(a) != want {
				t.Errorf("a route that %s: %s allowed = %v, but the written role table says %v and identity %v",
					class, r, want, roleActions[r][a], r.Allows(a))
			}
		}
	}
}

// TestRoleMatrix calls every route with a key and a user token of each
// role: a route that reads succeeds for every role, one that changes
// resources only for developers and above (a 403 that names the role for
// viewers), and nothing of the other project is visible to anyone (404).
// What each role may do is roleRoutes, checked first against identity's
// table (through roleActions) and then against every answer.
func TestRoleMatrix(t *testing.T) {
	checkIdentityTable(t)
	e := newEnv(t, "sqlite", noLimits)
	callers := roleCallers(t, e)

	// Resources of project a to aim at, and of project b.
	svc := e.readyService(map[string]any{"name": "target"})
	var vpc struct{ ID string }
	e.want(201, "", req{Method: "POST", Path: e.pa() + "/vpcs", Body: matrixBodies["vpcs"]}).decode(t, &vpc)
	var peering struct{ ID string }
	e.want(201, "", req{Method: "POST", Path: e.pa() + "/vpcs/" + vpc.ID + "/peerings", Body: matrixBodies["peerings"]}).decode(t, &peering)
	var rs struct{ ID string }
	e.want(202, "", req{Method: "POST", Path: e.pa() + "/services/" + svc.ServiceID + "/replicaSets", Body: matrixBodies["replicaSets"]}).decode(t, &rs)
	e.settle(rs.ID, dbcloud.StatusReady)
	var ops struct {
		Operations []struct{ ID string } `json:"operations"`
	}
	e.want(200, "", req{Method: "GET", Path: e.pa() + "/services/" + svc.ServiceID + "/operations"}).decode(t, &ops)
	if len(ops.Operations) == 0 {
		t.Fatal("no operation of the target service")
	}
	var cred struct{ ID string }
	e.want(201, "", req{Method: "POST", Path: e.pa() + "/services/" + svc.ServiceID + "/credentials", Body: matrixBodies["credentials"]}).decode(t, &cred)
	ids := map[string]string{"{vpc_id}": vpc.ID, "{peering_id}": peering.ID, "{service_id}": svc.ServiceID,
		"{replica_set_id}": rs.ID, "{operation_id}": ops.Operations[0].ID, "{credential_id}": cred.ID}

	h := http.NewHandler(e.cloud, noLimits, nil)
	routes := h.Routes()
	// Reads first, then writes, and deletions last, so that a permitted
	// deletion does not take away what the other calls aim at.
	order := func(r http.Route) int {
		switch {
		case r.Method == "GET":
			return 0
		case r.Method == "DELETE":
			return 2
		}
		return 1
	}
	var calls, refused, succeeded, foreign int
	for pass := 0; pass < 3; pass++ {
		for _, rt := range routes {
			if order(rt) != pass || rt.Path == "/auth/logout" {
				continue // logout ends the user's tokens: its own test
			}
			if strings.HasSuffix(rt.Path, "/events") {
				continue // a stream that does not end: TestEvents_Stream
			}
			path := rt.Path
			for k, v := range ids {
				path = strings.ReplaceAll(path, k, v)
			}
			inProject := strings.Contains(rt.Path, "{project_id}")
			// A query sent as a POST (the metrics preview) reads.
			reads := rt.Method == "GET" || strings.HasSuffix(rt.Path, "/metrics/series")
			class := readsProject
			if inProject && !reads {
				class = changesProject
			}
			if strings.Contains(rt.Path, "/credentials") && !reads {
				class = mintsReadOnly // the credential made below and the body here are READ_ONLY
			}
			var body any
			if rt.Body {
				seg := rt.Path[strings.LastIndex(rt.Path, "/")+1:]
				if body = matrixBodies[seg]; body == nil {
					body = map[string]any{}
				}
				if seg == "attachToVPC" || seg == "detachFromVPC" {
					body = map[string]any{"vpc_id": vpc.ID}
				}
			}
			// Least allowed first: a refused call changes nothing, so the
			// permitted ones after it still find their target.
			for i := len(callers) - 1; i >= 0; i-- {
				c := callers[i]
				p := strings.ReplaceAll(path, "{project_id}", e.a.ProjectID)
				res := e.do(c.req(req{Method: rt.Method, Path: p, Body: body}))
				calls++
				if res.Status == 403 {
					refused++
				} else if res.Status < 300 {
					succeeded++
				}
				var eb struct{ Code, Message string }
				json.Unmarshal(res.Body, &eb)
				allowed := roleRoutes[c.role][class]
				if allowed && reads {
					if res.Status != 200 {
						t.Errorf("%s %s as %s: %d %s, want 200", rt.Method, rt.Path, c.name, res.Status, res.Body)
					}
				} else if allowed {
					// A permitted change may still meet the resource's own
					// rules (a conflict, a state), never a refusal of the caller.
					if res.Status == 401 || res.Status == 403 || (res.Status == 404 && strings.HasPrefix(eb.Message, "Project")) {
						t.Errorf("%s %s as %s: %d %s, want it allowed", rt.Method, rt.Path, c.name, res.Status, res.Body)
					}
				} else if res.Status != 403 || eb.Code != "FORBIDDEN" || !strings.Contains(eb.Message, string(c.role)) {
					t.Errorf("%s %s as %s: %d %s, want 403 FORBIDDEN naming the role", rt.Method, rt.Path, c.name, res.Status, res.Body)
				}
				if inProject {
					pb := strings.ReplaceAll(path, "{project_id}", e.b.ProjectID)
					res := e.do(c.req(req{Method: rt.Method, Path: pb, Body: body}))
					foreign++
					if res.Status != 404 {
						t.Errorf("%s %s of the other project as %s: %d %s, want 404", rt.Method, rt.Path, c.name, res.Status, res.Body)
					}
				}
			}
		}
	}

	t.Logf("%d calls in project a: %d succeeded, %d refused with 403; %d calls into project b, all 404", calls, succeeded, refused, foreign)

	// GET /projects: a user sees the projects they belong to; a key its own.
	for _, c := range callers {
		var ps []struct{ ID string }
		e.want(200, "", c.req(req{Method: "GET", Path: "/projects"})).decode(t, &ps)
		if len(ps) != 1 || ps[0].ID != e.a.ProjectID {
			t.Errorf("GET /projects as %s: %+v, want project a only", c.name, ps)
		}
	}
}

// TestRoleLimits: keys act for their issuer (a disabled issuer's keys and
// tokens stop at once), admins cannot make owners, keys cannot outrank
// their issuer, and the last owner stays.
func TestRoleLimits(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	callers := roleCallers(t, e)
	ctx := context.Background()
	as := func(c caller) context.Context {
		p, err := e.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, c.token)
		if err != nil {
			t.Fatal(err)
		}
		return cloud.NewContextWithPrincipal(ctx, p)
	}
	owner, admin, developer := callers[0], callers[1], callers[2]
	if err := e.cloud.SetMember(as(admin), e.a.ProjectID, "viewer-user@example.com", identity.Owner); dbcloud.ErrorKindOf(err) != dbcloud.KindForbidden {
		t.Errorf("admin made an owner: %v", err)
	}
	if _, err := e.cloud.IssueAPIKey(as(admin), e.a.ProjectID, "too high", identity.Owner); dbcloud.ErrorKindOf(err) != dbcloud.KindForbidden {
		t.Errorf("admin issued an owner key: %v", err)
	}
	if _, err := e.cloud.IssueAPIKey(as(developer), e.a.ProjectID, "k", identity.Viewer); dbcloud.ErrorKindOf(err) != dbcloud.KindForbidden {
		t.Errorf("developer issued a key: %v", err)
	}
	// The admin's own key works until the admin is demoted to viewer,
	// then it may only read.
	k, err := e.cloud.IssueAPIKey(as(admin), e.a.ProjectID, "admin's", identity.Admin)
	if err != nil {
		t.Fatal(err)
	}
	e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: matrixBodies["services"], Key: k})
	if err := e.cloud.SetMember(as(owner), e.a.ProjectID, "admin-user@example.com", identity.Viewer); err != nil {
		t.Fatal(err)
	}
	e.want(403, "FORBIDDEN", req{Method: "POST", Path: e.pa() + "/services", Body: matrixBodies["services"], Key: k})
	e.want(200, "", req{Method: "GET", Path: e.pa() + "/services", Key: k})
	// Disabled: the key and the token answer 401.
	if err := e.cloud.DisableUser(ctx, "admin-user@example.com"); err != nil {
		t.Fatal(err)
	}
	e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: e.pa() + "/services", Key: k})
	e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", Bearer: admin.token})
	// The owner cannot step down while the only owner... once the bootstrap
	// admin is no longer one either.
	members, err := e.cloud.ListMembers(as(owner), e.a.ProjectID)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if m.User.Email == "admin@example.com" {
			if err := e.cloud.RemoveMember(as(owner), e.a.ProjectID, m.User.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := e.cloud.SetMember(as(owner), e.a.ProjectID, "owner-user@example.com", identity.Admin); dbcloud.ErrorKindOf(err) != dbcloud.KindConflict {
		t.Errorf("the last owner stepped down: %v", err)
	}
	// The bootstrap key acted for the removed admin: it stops.
	e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects"})
}

// TestUserToken: /auth/info answers type oauth for a user's access token,
// /projects lists every project the user belongs to, and /auth/logout ends
// the token; all checked against the contract.
func TestUserToken(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind, noLimits)
			callers := roleCallers(t, e)
			owner := callers[0]
			var info struct {
				Type  string
				OAuth struct{ User struct{ Email string } } `json:"oauth"`
			}
			e.want(200, "", req{Method: "GET", Path: "/auth/info", Bearer: owner.token}).decode(t, &info)
			if info.Type != "oauth" || info.OAuth.User.Email != "owner-user@example.com" {
				t.Fatalf("auth/info %+v", info)
			}
			// A member of both projects sees both.
			ctx := context.Background()
			p, _ := e.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, owner.token)
			boot, _ := e.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, userToken(t, e, bootstrapUser(t, e)))
			if err := e.cloud.SetMember(cloud.NewContextWithPrincipal(ctx, boot), e.b.ProjectID, p.User.Email, identity.Viewer); err != nil {
				t.Fatal(err)
			}
			var ps []struct{ ID string }
			e.want(200, "", req{Method: "GET", Path: "/projects", Bearer: owner.token}).decode(t, &ps)
			if len(ps) != 2 {
				t.Fatalf("projects of a member of two: %+v", ps)
			}
			e.want(200, "", req{Method: "GET", Path: "/projects/" + e.b.ProjectID + "/services", Bearer: owner.token})
			e.want(403, "FORBIDDEN", req{Method: "POST", Path: "/projects/" + e.b.ProjectID + "/services", Body: matrixBodies["services"], Bearer: owner.token})
			e.want(204, "", req{Method: "POST", Path: "/auth/logout", Body: map[string]any{"refresh_token": "not-a-token"}, Bearer: owner.token})
			e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", Bearer: owner.token})
			// A key's logout changes nothing.
			e.want(204, "", req{Method: "POST", Path: "/auth/logout"})
			e.want(200, "", req{Method: "GET", Path: "/projects"})
		})
	}
}

func bootstrapUser(t *testing.T, e *env) string {
	t.Helper()
	var id string
	err := e.store.View(context.Background(), func(tx dbcloud.Tx) error {
		k, err := tx.FindAPIKey(e.a.AccessKey)
		id = k.UserID
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestUserTokenIdempotency: a retry with the same Idempotency-Key and the
// same token replays; with a refreshed token of the same login it is a
// 409 that says the change was made, never a second create or a 500.
func TestUserTokenIdempotency(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	owner := roleCallers(t, e)[0]
	hdr := map[string]string{"Idempotency-Key": "create-once"}
	first := e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: matrixBodies["services"], Bearer: owner.token, Header: hdr})
	again := e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: matrixBodies["services"], Bearer: owner.token, Header: hdr})
	if string(first.Body) != string(again.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("the retry was not a replay")
	}
	// Another access token of the same login (as a refresh gives).
	p, _ := e.cloud.AuthenticateToken(context.Background(), dbcloud.TokenAccess, owner.token)
	var next string
	e.store.Update(context.Background(), func(tx dbcloud.Tx) (err error) {
		next, err = e.cloud.IssueUserToken(tx, &dbcloud.UserToken{Kind: dbcloud.TokenAccess, UserID: p.User.ID, Family: p.Token.Family}, time.Hour)
		return err
	})
	e.want(409, "CONFLICT", req{Method: "POST", Path: e.pa() + "/services", Body: matrixBodies["services"], Bearer: next, Header: hdr})
	var list []service
	e.want(200, "", req{Method: "GET", Path: e.pa() + "/services"}).decode(t, &list)
	if len(list) != 1 {
		t.Errorf("%d services, want 1", len(list))
	}
}

// TestRemoveMember_RevokesKeys: removing a member revokes, for good, every
// key the member issued in that project: adding the member back makes
// none of them valid again, and the key list shows them revoked. Keys of
// the member's other project stay valid.
func TestRemoveMember_RevokesKeys(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind, noLimits)
			callers := roleCallers(t, e)
			ctx := context.Background()
			as := func(c caller) context.Context {
				p, err := e.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, c.token)
				if err != nil {
					t.Fatal(err)
				}
				return cloud.NewContextWithPrincipal(ctx, p)
			}
			owner, admin := callers[0], callers[1]
			k, err := e.cloud.IssueAPIKey(as(admin), e.a.ProjectID, "admin's", identity.Admin)
			if err != nil {
				t.Fatal(err)
			}
			// The admin is also a member of project b, with a key there.
			boot, err := e.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, userToken(t, e, bootstrapUser(t, e)))
			if err != nil {
				t.Fatal(err)
			}
			if err := e.cloud.SetMember(cloud.NewContextWithPrincipal(ctx, boot), e.b.ProjectID, "admin-user@example.com", identity.Admin); err != nil {
				t.Fatal(err)
			}
			kb, err := e.cloud.IssueAPIKey(as(admin), e.b.ProjectID, "admin's in b", identity.Admin)
			if err != nil {
				t.Fatal(err)
			}
			e.want(200, "", req{Method: "GET", Path: e.pa() + "/services", Key: k})
			adminP, err := e.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, admin.token)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.cloud.RemoveMember(as(owner), e.a.ProjectID, adminP.User.ID); err != nil {
				t.Fatal(err)
			}
			e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: e.pa() + "/services", Key: k})
			if err := e.cloud.SetMember(as(owner), e.a.ProjectID, "admin-user@example.com", identity.Admin); err != nil {
				t.Fatal(err)
			}
			e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: e.pa() + "/services", Key: k})
			keys, err := e.cloud.ProjectAPIKeys(as(owner), e.a.ProjectID)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range keys {
				if x.AccessKey == k.AccessKey && x.Revoked == nil {
					t.Errorf("key %s of the removed member is listed as not revoked", x.AccessKey)
				}
			}
			e.want(200, "", req{Method: "GET", Path: "/projects/" + e.b.ProjectID + "/services", Key: kb})
		})
	}
}
