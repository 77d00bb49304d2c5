package http_test

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/identity"
)

type credentialOut struct {
	ID, Name, Username, Access string
	Created, Expires           time.Time
	Password                   string `json:"password"`
	ConnectionString           string `json:"connection_string"`
	CreatedBy                  struct {
		AccessKey string `json:"access_key"`
	} `json:"created_by"`
}

// TestCredentials_Contract: the API of decisions.md section 12 against the
// domain: the password shown once and only in the create's answer, the
// viewer limited to READ_ONLY, bad input refused with nothing made, a
// service that is not READY refused, a revocation that reaches the runtime
// before its 204, and both recorded in the service's operations.
func TestCredentials_Contract(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	callers := roleCallers(t, e)
	var viewer caller
	for _, c := range callers {
		if c.role == identity.Viewer && c.key != nil {
			viewer = c
		}
	}
	svc := e.readyService(map[string]any{"name": "db"})
	path := e.pa() + "/services/" + svc.ServiceID + "/credentials"

	var ro credentialOut
	e.want(201, "", viewer.req(req{Method: "POST", Path: path, Body: map[string]any{"name": "dashboard", "ttl_seconds": 120}})).decode(t, &ro)
	if ro.Access != "READ_ONLY" || ro.Password == "" || ro.Username != dbcloud.CredentialUsername(ro.ID) ||
		ro.Expires.Sub(ro.Created) != 120*time.Second || ro.CreatedBy.AccessKey != viewer.key.AccessKey {
		t.Fatalf("created %+v", ro)
	}
	u, err := url.Parse(ro.ConnectionString)
	if err != nil || u.User.Username() != ro.Username || u.Path != "/tsdb" || u.Query().Get("sslmode") != "require" {
		t.Errorf("connection string %q", ro.ConnectionString)
	}
	if pw, _ := u.User.Password(); pw != ro.Password {
		t.Errorf("connection string's password is not the credential's")
	}
	roles := e.runtime.roles[svc.ServiceID]
	if len(roles) != 1 || roles[0].Username != ro.Username || !roles[0].ReadOnly || strings.Contains(roles[0].Verifier, ro.Password) {
		t.Fatalf("runtime roles after create: %+v", roles)
	}

	// A viewer may not make what it could not do itself.
	res := e.want(403, "FORBIDDEN", viewer.req(req{Method: "POST", Path: path, Body: map[string]any{"name": "writer", "access": "READ_WRITE"}}))
	if !strings.Contains(string(res.Body), "viewer") {
		t.Errorf("refusal does not name the role: %s", res.Body)
	}
	var rw credentialOut
	e.want(201, "", req{Method: "POST", Path: path, Body: map[string]any{"name": "writer", "access": "READ_WRITE", "ttl_seconds": 3600}}).decode(t, &rw)

	for _, bad := range []map[string]any{
		{"name": "x", "ttl_seconds": 59}, {"name": "x", "ttl_seconds": 2592001}, {"name": "x", "access": "ADMIN"},
		{"name": ""}, {"access": "READ_ONLY"},
	} {
		e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path, Body: bad})
	}

	// The list: both, with no password anywhere.
	res = e.want(200, "", viewer.req(req{Method: "GET", Path: path}))
	var list []map[string]any
	if err := json.Unmarshal(res.Body, &list); err != nil || len(list) != 2 {
		t.Fatalf("list: %s", res.Body)
	}
	if strings.Contains(string(res.Body), ro.Password) || strings.Contains(string(res.Body), "password") || strings.Contains(string(res.Body), "verifier") {
		t.Errorf("the list shows a secret: %s", res.Body)
	}

	// Revoke: the runtime no longer has the role when the 204 comes.
	e.want(204, "", viewer.req(req{Method: "DELETE", Path: path + "/" + ro.ID}))
	if roles := e.runtime.roles[svc.ServiceID]; len(roles) != 1 || roles[0].Username != rw.Username {
		t.Errorf("runtime roles after revoke: %+v", roles)
	}
	e.want(403, "FORBIDDEN", viewer.req(req{Method: "DELETE", Path: path + "/" + rw.ID}))
	e.want(404, "", req{Method: "DELETE", Path: path + "/nosuchcred"})
	res = e.want(200, "", req{Method: "GET", Path: path})
	if strings.Contains(string(res.Body), ro.ID) {
		t.Errorf("a revoked credential is still listed: %s", res.Body)
	}

	// History: the create and the revocation are operations of the service.
	var ops struct {
		Operations []struct {
			Type, State string
			ResourceID  string `json:"resource_id"`
		} `json:"operations"`
	}
	e.want(200, "", req{Method: "GET", Path: e.pa() + "/services/" + svc.ServiceID + "/operations"}).decode(t, &ops)
	seen := map[string]bool{}
	for _, op := range ops.Operations {
		if op.ResourceID == ro.ID && op.State == "succeeded" {
			seen[op.Type] = true
		}
	}
	if !seen["create_credential"] || !seen["revoke_credential"] {
		t.Errorf("operations of the service: %+v", ops.Operations)
	}

	// Not READY: refused, nothing made.
	e.settle(svc.ServiceID, dbcloud.StatusPaused)
	e.want(409, "", req{Method: "POST", Path: path, Body: map[string]any{"name": "late"}})
	res = e.want(200, "", req{Method: "GET", Path: path})
	if strings.Contains(string(res.Body), "late") {
		t.Errorf("a refused create left a credential: %s", res.Body)
	}
}

// TestCredentials_Idempotent: a create retried with its Idempotency-Key
// answers the first create's 201 (its password too, sealed for the
// caller) and makes no second credential.
func TestCredentials_Idempotent(t *testing.T) {
	e := newEnv(t, "sqlite", noLimits)
	svc := e.readyService(map[string]any{"name": "db"})
	path := e.pa() + "/services/" + svc.ServiceID + "/credentials"
	r := req{Method: "POST", Path: path, Body: map[string]any{"name": "agent"}, Header: map[string]string{"Idempotency-Key": "cred-1"}}
	var first, again credentialOut
	e.want(201, "", r).decode(t, &first)
	e.want(201, "", r).decode(t, &again)
	if again.ID != first.ID || again.Password != first.Password {
		t.Errorf("the retry answered %+v, the first %+v", again, first)
	}
	var list []struct{ ID string }
	e.want(200, "", req{Method: "GET", Path: path}).decode(t, &list)
	if len(list) != 1 {
		t.Errorf("%d credentials after a create and its retry, want 1", len(list))
	}
}
