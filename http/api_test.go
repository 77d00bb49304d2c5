package http_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"dbcloud/cloud"

	"github.com/getkin/kin-openapi/openapi3"

	"dbcloud"
	"dbcloud/http"
)

// forEachStore runs fn against every store implementation.
func forEachStore(t *testing.T, fn func(t *testing.T, kind string)) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { fn(t, kind) })
	}
}

func TestAuth(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		t.Run("ErrNoCredentials", func(t *testing.T) {
			e := e.with(t)
			res := e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", NoAuth: true})
			if res.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
		t.Run("ErrWrongSecret", func(t *testing.T) {
			e := e.with(t)
			bad := &cloud.NewAPIKey{AccessKey: e.a.AccessKey, SecretKey: "wrong"}
			e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", Key: bad})
		})
		t.Run("ErrUnknownScheme", func(t *testing.T) {
			e := e.with(t)
			e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", NoAuth: true,
				Header: map[string]string{"Authorization": "Digest abc"}})
		})
		t.Run("Bearer", func(t *testing.T) {
			e := e.with(t)
			e.want(200, "", req{Method: "GET", Path: "/projects", NoAuth: true,
				Header: map[string]string{"Authorization": "Bearer " + e.a.AccessKey + ":" + e.a.SecretKey}})
		})
		t.Run("Info", func(t *testing.T) {
			e := e.with(t)
			var info struct {
				Type   string `json:"type"`
				APIKey struct {
					PublicKey string `json:"public_key"`
					Project   struct{ ID string }
				} `json:"api_key"`
				Camel struct {
					PublicKey string `json:"public_key"`
				} `json:"apiKey"`
			}
			e.want(200, "", req{Method: "GET", Path: "/auth/info"}).decode(t, &info)
			if info.Type != "apiKey" || info.APIKey.PublicKey != e.a.AccessKey || info.Camel.PublicKey != e.a.AccessKey ||
				info.APIKey.Project.ID != e.a.ProjectID {
				t.Errorf("auth info = %+v", info)
			}
		})
		t.Run("Logout", func(t *testing.T) {
			e := e.with(t)
			e.want(401, "UNAUTHORIZED", req{Method: "POST", Path: "/auth/logout", NoAuth: true})
			e.want(204, "", req{Method: "POST", Path: "/auth/logout"})
			// An API key has no session to end: it stays valid until revoked.
			e.want(200, "", req{Method: "GET", Path: "/auth/info"})
		})
		t.Run("ProjectsSeesOwnOnly", func(t *testing.T) {
			e := e.with(t)
			var ps []struct{ ID, Name string }
			e.want(200, "", req{Method: "GET", Path: "/projects"}).decode(t, &ps)
			if len(ps) != 1 || ps[0].ID != e.a.ProjectID {
				t.Errorf("projects = %+v, want only %s", ps, e.a.ProjectID)
			}
		})
		t.Run("RevokedKeyFailsAtOnce", func(t *testing.T) {
			e := e.with(t)
			k, err := e.cloud.CreateAPIKey(t.Context(), e.a.ProjectID, "short-lived", "admin", "admin@example.com")
			if err != nil {
				t.Fatal(err)
			}
			e.want(200, "", req{Method: "GET", Path: "/projects", Key: k})
			if err := e.cloud.RevokeAPIKey(t.Context(), k.AccessKey); err != nil {
				t.Fatal(err)
			}
			e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", Key: k})
		})
	})
}

func TestWire(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		t.Run("ErrUnknownPath", func(t *testing.T) {
			e := e.with(t)
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: "/nope"})
		})
		t.Run("ErrWrongMethod", func(t *testing.T) {
			e := e.with(t)
			res := e.want(405, "METHOD_NOT_ALLOWED", req{Method: "PUT", Path: "/projects"})
			if res.Header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
		t.Run("RequestIDEchoed", func(t *testing.T) {
			e := e.with(t)
			res := e.do(req{Method: "GET", Path: "/projects", Header: map[string]string{"X-Request-Id": "abc-123"}})
			if got := res.Header.Get("X-Request-Id"); got != "abc-123" {
				t.Errorf("X-Request-Id = %q, want abc-123", got)
			}
		})
		t.Run("ErrMalformedJSON", func(t *testing.T) {
			e := e.with(t)
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: e.pa() + "/vpcs", Body: `{"name":`})
		})
		t.Run("ErrWrongFieldType", func(t *testing.T) {
			e := e.with(t)
			res := e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: e.pa() + "/services", Body: `{"name": 5}`})
			if !strings.Contains(string(res.Body), "name") {
				t.Errorf("message does not name the field: %s", res.Body)
			}
		})
		t.Run("ErrMediaType", func(t *testing.T) {
			e := e.with(t)
			e.want(415, "UNSUPPORTED_MEDIA_TYPE", req{Method: "POST", Path: e.pa() + "/vpcs", Body: `{}`,
				Header: map[string]string{"Content-Type": "text/plain"}})
		})
		t.Run("ErrTooLarge", func(t *testing.T) {
			e := e.with(t)
			big := `{"name":"` + strings.Repeat("x", http.MaxBodyBytes) + `"}`
			e.want(413, "PAYLOAD_TOO_LARGE", req{Method: "POST", Path: e.pa() + "/services", Body: big})
		})
		t.Run("UnknownFieldsIgnored", func(t *testing.T) {
			e := e.with(t)
			e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "x", "colour": "blue"}})
		})
		t.Run("OpenAPIServed", func(t *testing.T) {
			e := e.with(t)
			res, err := e.srv.Client().Get(e.srv.URL + http.BasePath + "/openapi.yaml")
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("GET openapi.yaml: %v %v", res, err)
			}
			raw, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			// What is served parses as OpenAPI 3 and describes every route
			// the server has.
			doc, err := openapi3.NewLoader().LoadFromData(raw)
			if err != nil {
				t.Fatalf("served openapi.yaml does not parse: %v", err)
			}
			for _, rt := range (&http.Handler{}).Routes() {
				if item := doc.Paths.Find(rt.Path); item == nil || item.GetOperation(rt.Method) == nil {
					t.Errorf("served openapi.yaml lacks %s %s", rt.Method, rt.Path)
				}
			}
		})
		t.Run("Health", func(t *testing.T) {
			e := e.with(t)
			for _, p := range []string{"/healthz", "/readyz"} {
				res, err := e.srv.Client().Get(e.srv.URL + p)
				if err != nil || res.StatusCode != 200 {
					t.Fatalf("GET %s: %v %v", p, res, err)
				}
				res.Body.Close()
			}
		})
	})
}

func TestVPCs(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		vpcs := e.pa() + "/vpcs"
		var v struct{ ID, CIDR, Name, RegionCode string }
		e.want(201, "", req{Method: "POST", Path: vpcs, Body: map[string]string{"name": "main", "cidr": "10.0.0.0/16", "region_code": "local"}}).decode(t, &v)
		if !dbcloud.IsNumericID(v.ID) {
			t.Errorf("VPC id %q is not a decimal string", v.ID)
		}
		t.Run("ErrCIDR", func(t *testing.T) {
			e := e.with(t)
			for _, c := range []string{"10.0.0.1/16", "10.0.0.0/8", "10.0.0.0/29", "8.8.0.0/16", "fd00::/16", "banana", "172.32.0.0/16", ""} {
				e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: vpcs, Body: map[string]string{"name": "x", "cidr": c, "region_code": "local"}})
			}
		})
		t.Run("ErrOverlap", func(t *testing.T) {
			e := e.with(t)
			e.want(409, dbcloud.CodeCIDRConflict, req{Method: "POST", Path: vpcs, Body: map[string]string{"name": "x", "cidr": "10.0.128.0/17", "region_code": "local"}})
		})
		t.Run("OtherProjectMayOverlap", func(t *testing.T) {
			e := e.with(t)
			e.want(201, "", req{Method: "POST", Path: "/projects/" + e.b.ProjectID + "/vpcs", Key: e.b,
				Body: map[string]string{"name": "x", "cidr": "10.0.0.0/16", "region_code": "local"}})
		})
		t.Run("ErrMissingField", func(t *testing.T) {
			e := e.with(t)
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: vpcs, Body: map[string]string{"name": "x", "cidr": "10.9.0.0/16"}})
		})
		t.Run("ErrUnknownRegion", func(t *testing.T) {
			e := e.with(t)
			res := e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: vpcs, Body: map[string]string{"name": "x", "cidr": "10.9.0.0/16", "region_code": "mars-1"}})
			if !strings.Contains(string(res.Body), "local") {
				t.Errorf("message does not list the regions: %s", res.Body)
			}
		})
		t.Run("ErrName", func(t *testing.T) {
			e := e.with(t)
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: vpcs, Body: map[string]string{"name": strings.Repeat("n", 129), "cidr": "10.9.0.0/16", "region_code": "local"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: vpcs, Body: map[string]string{"name": "a\x00b", "cidr": "10.9.0.0/16", "region_code": "local"}})
		})
		t.Run("GetListRename", func(t *testing.T) {
			e := e.with(t)
			e.want(200, "", req{Method: "GET", Path: vpcs + "/" + v.ID})
			var list []struct{ ID string }
			e.want(200, "", req{Method: "GET", Path: vpcs}).decode(t, &list)
			if len(list) != 1 || list[0].ID != v.ID {
				t.Errorf("list = %+v", list)
			}
			e.want(200, "", req{Method: "POST", Path: vpcs + "/" + v.ID + "/rename", Body: map[string]string{"name": "renamed"}})
			var got struct{ Name string }
			e.want(200, "", req{Method: "GET", Path: vpcs + "/" + v.ID}).decode(t, &got)
			if got.Name != "renamed" {
				t.Errorf("name = %q after rename", got.Name)
			}
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: vpcs + "/" + v.ID + "/rename", Body: map[string]string{"name": ""}})
			e.want(404, "NOT_FOUND", req{Method: "POST", Path: vpcs + "/999/rename", Body: map[string]string{"name": "x"}})
		})
		t.Run("ErrGetUnknown", func(t *testing.T) {
			e := e.with(t)
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: vpcs + "/12345"})
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: vpcs + "/not-a-number"})
		})
		t.Run("Peerings", func(t *testing.T) {
			e := e.with(t)
			peerings := vpcs + "/" + v.ID + "/peerings"
			body := map[string]string{"peer_account_id": "123456789012", "peer_region_code": "us-east-1", "peer_vpc_id": "vpc-0abc"}
			var p struct{ ID, Status string }
			e.want(201, "", req{Method: "POST", Path: peerings, Body: body}).decode(t, &p)
			if p.Status != "pending" {
				t.Errorf("new peering status %q, want pending", p.Status)
			}
			e.want(409, "CONFLICT", req{Method: "POST", Path: peerings, Body: body})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: peerings, Body: map[string]string{"peer_account_id": "1"}})
			e.want(200, "", req{Method: "GET", Path: peerings + "/" + p.ID})
			var list []struct{ ID string }
			e.want(200, "", req{Method: "GET", Path: peerings}).decode(t, &list)
			if len(list) != 1 {
				t.Errorf("peerings = %+v", list)
			}
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: peerings + "/1"})
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: vpcs + "/1/peerings"})

			// A VPC with a peering cannot go; the message names the peering.
			res := e.want(409, "CONFLICT", req{Method: "DELETE", Path: vpcs + "/" + v.ID})
			if !strings.Contains(string(res.Body), p.ID) {
				t.Errorf("409 does not name peering %s: %s", p.ID, res.Body)
			}
			e.want(204, "", req{Method: "DELETE", Path: peerings + "/" + p.ID})
			var got struct{ Status string }
			e.want(200, "", req{Method: "GET", Path: peerings + "/" + p.ID}).decode(t, &got)
			if got.Status != "deleting" {
				t.Errorf("deleted peering status %q, want deleting", got.Status)
			}
			e.want(204, "", req{Method: "DELETE", Path: peerings + "/" + p.ID})
		})
		t.Run("DeleteWithService", func(t *testing.T) {
			e := e.with(t)
			var w struct{ ID string }
			e.want(201, "", req{Method: "POST", Path: vpcs, Body: map[string]string{"name": "w", "cidr": "192.168.0.0/24", "region_code": "local"}}).decode(t, &w)
			s := e.readyService(map[string]any{"name": "in-vpc"})
			e.want(202, "", req{Method: "POST", Path: e.pa() + "/services/" + s.ServiceID + "/attachToVPC", Body: map[string]string{"vpc_id": w.ID}})
			res := e.want(409, "CONFLICT", req{Method: "DELETE", Path: vpcs + "/" + w.ID})
			if !strings.Contains(string(res.Body), s.ServiceID) {
				t.Errorf("409 does not name service %s: %s", s.ServiceID, res.Body)
			}
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(202, "", req{Method: "POST", Path: e.pa() + "/services/" + s.ServiceID + "/detachFromVPC", Body: map[string]string{"vpc_id": w.ID}})
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(204, "", req{Method: "DELETE", Path: vpcs + "/" + w.ID})
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: vpcs + "/" + w.ID})
		})
		t.Run("ErrQuota", func(t *testing.T) {
			e := e.with(t)
			var list []struct{ ID string }
			e.want(200, "", req{Method: "GET", Path: vpcs}).decode(t, &list)
			for i := len(list); i < cloud.DefaultQuotas.VPCs; i++ {
				e.want(201, "", req{Method: "POST", Path: vpcs, Body: map[string]string{"name": "q", "cidr": fmt.Sprintf("172.16.%d.0/24", i), "region_code": "local"}})
			}
			res := e.want(409, dbcloud.CodeQuotaExceeded, req{Method: "POST", Path: vpcs, Body: map[string]string{"name": "q", "cidr": "172.17.0.0/24", "region_code": "local"}})
			if !strings.Contains(string(res.Body), "10") {
				t.Errorf("quota message does not give the limit: %s", res.Body)
			}
		})
	})
}

func TestServices_Create(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		services := e.pa() + "/services"
		t.Run("Defaults", func(t *testing.T) {
			e := e.with(t)
			s := e.createService(map[string]any{"name": "db"})
			if s.Status != "QUEUED" || s.InitialPassword == "" || s.Endpoint == nil || s.Endpoint.Port == 0 {
				t.Fatalf("create response = %+v", s)
			}
			if !dbcloud.IsID(s.ServiceID) || s.ServiceType != "POSTGRES" || s.RegionCode != "local" || s.Metadata.Environment != "DEV" {
				t.Errorf("create response = %+v", s)
			}
			if len(s.Resources) != 1 || *s.Resources[0].Spec.CPUMillis != 500 || *s.Resources[0].Spec.MemoryGBs != 2 {
				t.Errorf("resources = %+v, want one 500/2", s.Resources)
			}
			got := e.getService(s.ServiceID)
			if got.InitialPassword != "" {
				t.Error("GET shows initial_password; it is shown only at creation")
			}
			if got.Endpoint == nil || got.Endpoint.Port != s.Endpoint.Port {
				t.Errorf("endpoint changed: %+v vs %+v", got.Endpoint, s.Endpoint)
			}
		})
		t.Run("Sizes", func(t *testing.T) {
			e := e.with(t)
			s := e.createService(map[string]any{"name": "db", "cpu_millis": "2000"})
			if *s.Resources[0].Spec.MemoryGBs != 8 {
				t.Errorf("cpu 2000 gave memory %d, want 8", *s.Resources[0].Spec.MemoryGBs)
			}
			s = e.createService(map[string]any{"name": "db", "memory_gbs": "16"})
			if *s.Resources[0].Spec.CPUMillis != 4000 {
				t.Errorf("memory 16 gave cpu %d, want 4000", *s.Resources[0].Spec.CPUMillis)
			}
			s = e.createService(map[string]any{"name": "db", "cpu_millis": "shared", "memory_gbs": "shared"})
			if s.Resources[0].Spec.CPUMillis != nil {
				t.Errorf("shared service reports cpu %d", *s.Resources[0].Spec.CPUMillis)
			}
			for _, bad := range []map[string]any{
				{"name": "db", "cpu_millis": "700"},
				{"name": "db", "cpu_millis": "1000", "memory_gbs": "8"},
				{"name": "db", "cpu_millis": "shared", "memory_gbs": "2"},
				{"name": "db", "cpu_millis": "-1"},
			} {
				res := e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: bad})
				if !strings.Contains(string(res.Body), "1000/4") {
					t.Errorf("size error does not list the allowed pairs: %s", res.Body)
				}
			}
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: map[string]any{"name": "db", "cpu_millis": 1000}})
		})
		t.Run("Addons", func(t *testing.T) {
			e := e.with(t)
			s := e.createService(map[string]any{"name": "v", "addons": []string{"ai"}})
			if s.ServiceType != "VECTOR" {
				t.Errorf("ai addon gave type %s, want VECTOR", s.ServiceType)
			}
			res := e.want(400, dbcloud.CodeAddonUnavailable, req{Method: "POST", Path: services, Body: map[string]any{"name": "t", "addons": []string{"time-series"}}})
			if !strings.Contains(string(res.Body), "timescaledb") {
				t.Errorf("message does not name the extension: %s", res.Body)
			}
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: map[string]any{"name": "t", "addons": []string{"graph"}}})
		})
		t.Run("Errors", func(t *testing.T) {
			e := e.with(t)
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: map[string]any{}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: map[string]any{"name": ""}})
			// Bidirectional overrides make a console or log show another name.
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: map[string]any{"name": "invoice\u202efdp.exe"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: e.pa() + "/vpcs", Body: map[string]any{"name": "a\u2066b", "cidr": "10.9.0.0/16", "region_code": "local"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: map[string]any{"name": "x", "region_code": "mars-1"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: map[string]any{"name": "x", "environment_tag": "STAGING"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: map[string]any{"name": "x", "replica_count": -1}})
			// HA on DEV is allowed (decisions.md section 5).
			e.want(202, "", req{Method: "POST", Path: services, Body: map[string]any{"name": "x", "replica_count": 1}})
			e.want(409, dbcloud.CodeQuotaExceeded, req{Method: "POST", Path: services, Body: map[string]any{"name": "x", "replica_count": 3, "environment_tag": "PROD"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: ""})
		})
		t.Run("HAOnCreate", func(t *testing.T) {
			e := e.with(t)
			s := e.createService(map[string]any{"name": "ha", "replica_count": 2, "environment_tag": "PROD"})
			if s.HAReplicas == nil || s.HAReplicas.ReplicaCount != 2 || len(s.Resources) != 3 {
				t.Errorf("ha = %+v, resources %d; want 2 replicas, 3 instances", s.HAReplicas, len(s.Resources))
			}
		})
		t.Run("List", func(t *testing.T) {
			e := e.with(t)
			var list []service
			e.want(200, "", req{Method: "GET", Path: services}).decode(t, &list)
			if len(list) < 5 {
				t.Errorf("list has %d services", len(list))
			}
			for _, s := range list {
				if s.InitialPassword != "" {
					t.Error("list shows initial_password")
				}
			}
		})
	})
}

func TestServices_Lifecycle(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		svc := func(id, action string) string { return e.pa() + "/services/" + id + action }

		t.Run("InFlightConflicts", func(t *testing.T) {
			e := e.with(t)
			s := e.createService(map[string]any{"name": "q"})
			e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: svc(s.ServiceID, "/stop")})
			e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}})
			e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: svc(s.ServiceID, "/updatePassword"), Body: map[string]string{"password": "a-long-password"}})
			// Delete supersedes the create in flight.
			e.want(202, "", req{Method: "DELETE", Path: svc(s.ServiceID, "")})
			if got := e.getService(s.ServiceID); got.Status != "DELETING" {
				t.Errorf("status after delete = %s, want DELETING", got.Status)
			}
			e.want(202, "", req{Method: "DELETE", Path: svc(s.ServiceID, "")})
		})
		t.Run("StopStart", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "ss"})
			var got service
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/stop")}).decode(t, &got)
			if got.Status != "PAUSING" {
				t.Errorf("stop answered %s, want PAUSING", got.Status)
			}
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/stop")}) // a repeat is a no-op
			e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: svc(s.ServiceID, "/start")})
			e.settle(s.ServiceID, dbcloud.StatusPaused)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/stop")}).decode(t, &got)
			if got.Status != "PAUSED" {
				t.Errorf("stop on PAUSED answered %s", got.Status)
			}
			// Resize of a PAUSED service waits for the next start.
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}}).decode(t, &got)
			if got.Status != "PAUSED" || *got.Resources[0].Spec.CPUMillis != 1000 {
				t.Errorf("resize of PAUSED answered %s %+v", got.Status, got.Resources)
			}
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/start")}).decode(t, &got)
			if got.Status != "RESUMING" {
				t.Errorf("start answered %s, want RESUMING", got.Status)
			}
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/start")}).decode(t, &got)
			if got.Status != "READY" {
				t.Errorf("start on READY answered %s", got.Status)
			}
		})
		t.Run("Resize", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "rz"})
			var got service
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "2000", "memory_gbs": "8"}}).decode(t, &got)
			if got.Status != "CONFIGURING" {
				t.Errorf("resize answered %s", got.Status)
			}
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "2000", "memory_gbs": "8"}}).decode(t, &got)
			if got.Status != "READY" {
				t.Errorf("same-size resize answered %s, want a READY no-op", got.Status)
			}
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "2000"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/resize"), Body: map[string]string{"cpu_millis": "3", "memory_gbs": "8"}})
		})
		t.Run("EnvironmentRules", func(t *testing.T) {
			// HA, the pooler and read replica sets are allowed on DEV; PROD
			// only adds delete protection; setEnvironment never removes
			// anything (decisions.md section 5).
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "env"})
			var got service
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/setHA"), Body: map[string]int{"replica_count": 2, "sync_replica_count": 1}}).decode(t, &got)
			if got.Status != "CONFIGURING" || got.HAReplicas.ReplicaCount != 2 || got.HAReplicas.SyncReplicaCount != 1 {
				t.Errorf("setHA on DEV answered %+v", got)
			}
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(200, "", req{Method: "POST", Path: svc(s.ServiceID, "/enablePooler")})
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/replicaSets"), Body: map[string]any{"name": "r", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/setEnvironment"), Body: map[string]string{"environment": "QA"}})
			e.want(200, "", req{Method: "POST", Path: svc(s.ServiceID, "/setEnvironment"), Body: map[string]string{"environment": "PROD"}})
			e.want(409, dbcloud.CodeDeleteProtected, req{Method: "DELETE", Path: svc(s.ServiceID, "")})
			e.want(409, dbcloud.CodeQuotaExceeded, req{Method: "POST", Path: svc(s.ServiceID, "/setHA"), Body: map[string]int{"replica_count": 1, "sync_replica_count": 2}})
			e.want(409, dbcloud.CodeQuotaExceeded, req{Method: "POST", Path: svc(s.ServiceID, "/setHA"), Body: map[string]int{"replica_count": 3}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/setHA"), Body: map[string]int{"replica_count": -1}})

			e.want(200, "", req{Method: "POST", Path: svc(s.ServiceID, "/setEnvironment"), Body: map[string]string{"environment": "DEV"}})
			got = e.getService(s.ServiceID)
			if got.Metadata.Environment != "DEV" || got.HAReplicas.ReplicaCount != 2 || got.ConnectionPooler == nil || len(got.ReadReplicaSets) != 1 {
				t.Errorf("setEnvironment DEV removed something: %+v", got)
			}
			e.want(202, "", req{Method: "DELETE", Path: svc(s.ServiceID, "")})
		})
		t.Run("UpdatePassword", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "pw"})
			e.want(204, "", req{Method: "POST", Path: svc(s.ServiceID, "/updatePassword"), Body: map[string]string{"password": "correct horse battery"}})
			if v := e.runtime.passwords[s.ServiceID]; !strings.HasPrefix(v, "SCRAM-SHA-256$4096:") {
				t.Errorf("runtime got %q, want a SCRAM verifier", v)
			}
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/updatePassword"), Body: map[string]string{"password": "short"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/updatePassword"), Body: map[string]string{}})
		})
		t.Run("Fork", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "parent", "cpu_millis": "1000"})
			fork := svc(s.ServiceID, "/forkService")
			var f service
			e.want(202, "", req{Method: "POST", Path: fork, Body: map[string]string{"fork_strategy": "LAST_SNAPSHOT"}}).decode(t, &f)
			if f.Status != "QUEUED" || f.InitialPassword == "" || f.Name != "parent-fork" || f.ForkedFrom == nil ||
				f.ForkedFrom.ServiceID != s.ServiceID || f.ForkedFrom.IsStandby || *f.Resources[0].Spec.CPUMillis != 1000 {
				t.Errorf("fork response = %+v", f)
			}
			var now service
			e.want(202, "", req{Method: "POST", Path: fork, Body: map[string]string{"fork_strategy": "NOW", "name": "now", "cpu_millis": "500"}}).decode(t, &now)
			// The parent cannot go while a fork is still copying its data.
			res := e.want(409, dbcloud.CodeOperationInProgress, req{Method: "DELETE", Path: svc(s.ServiceID, "")})
			if !strings.Contains(string(res.Body), f.ServiceID) {
				t.Errorf("409 does not name the fork: %s", res.Body)
			}
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: fork, Body: map[string]string{}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: fork, Body: map[string]string{"fork_strategy": "YESTERDAY"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: fork, Body: map[string]string{"fork_strategy": "PITR"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: fork, Body: map[string]string{"fork_strategy": "PITR", "target_time": "yesterday"}})
			res = e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: fork, Body: map[string]string{"fork_strategy": "PITR", "target_time": "2001-01-01T00:00:00Z"}})
			if !strings.Contains(string(res.Body), "window") {
				t.Errorf("PITR error does not name the window: %s", res.Body)
			}
			e.want(202, "", req{Method: "POST", Path: fork, Body: map[string]string{"fork_strategy": "PITR", "target_time": time.Now().UTC().Format(time.RFC3339Nano)}})
			e.want(404, "NOT_FOUND", req{Method: "POST", Path: svc("zzzzzzzzzz", "/forkService"), Body: map[string]string{"fork_strategy": "NOW"}})
			// Nor can it stop while a NOW fork copies its running data (the
			// fork would then fail); forks from snapshots do not need it running.
			res = e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: svc(s.ServiceID, "/stop")})
			if !strings.Contains(string(res.Body), now.ServiceID) {
				t.Errorf("409 does not name the NOW fork: %s", res.Body)
			}
			e.settle(now.ServiceID, dbcloud.StatusReady)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/stop")})
		})
		t.Run("VPCAttach", func(t *testing.T) {
			e := e.with(t)
			var v1, v2 struct{ ID string }
			e.want(201, "", req{Method: "POST", Path: e.pa() + "/vpcs", Body: map[string]string{"name": "a", "cidr": "10.1.0.0/16", "region_code": "local"}}).decode(t, &v1)
			e.want(201, "", req{Method: "POST", Path: e.pa() + "/vpcs", Body: map[string]string{"name": "b", "cidr": "10.2.0.0/16", "region_code": "local"}}).decode(t, &v2)
			s := e.readyService(map[string]any{"name": "net"})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/attachToVPC"), Body: map[string]string{"vpc_id": "abc"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/attachToVPC"), Body: map[string]string{"vpc_id": "4242"}})
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/attachToVPC"), Body: map[string]string{"vpc_id": v1.ID}})
			if got := e.getService(s.ServiceID); got.Status != "CONFIGURING" {
				t.Errorf("attach left status %s, want CONFIGURING", got.Status)
			}
			e.settle(s.ServiceID, dbcloud.StatusReady)
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/attachToVPC"), Body: map[string]string{"vpc_id": v1.ID}})
			e.want(409, "CONFLICT", req{Method: "POST", Path: svc(s.ServiceID, "/attachToVPC"), Body: map[string]string{"vpc_id": v2.ID}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/detachFromVPC"), Body: map[string]string{"vpc_id": v2.ID}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: svc(s.ServiceID, "/detachFromVPC"), Body: map[string]string{}})
			e.want(202, "", req{Method: "POST", Path: svc(s.ServiceID, "/detachFromVPC"), Body: map[string]string{"vpc_id": v1.ID}})
		})
		t.Run("Logs", func(t *testing.T) {
			e := e.with(t)
			s := e.readyService(map[string]any{"name": "logs"})
			var l struct {
				Logs []string `json:"logs"`
			}
			e.want(200, "", req{Method: "GET", Path: svc(s.ServiceID, "/logs?severities=ERROR&search=a&search=b")}).decode(t, &l)
			if l.Logs == nil {
				t.Error("logs is absent; it is required even when empty")
			}
			e.want(400, "INVALID_REQUEST", req{Method: "GET", Path: svc(s.ServiceID, "/logs?since=yesterday")})
			e.want(400, "INVALID_REQUEST", req{Method: "GET", Path: svc(s.ServiceID, "/logs?node=-1")})
			e.want(400, "INVALID_REQUEST", req{Method: "GET", Path: svc(s.ServiceID, "/logs?node=3")})
			e.want(400, "INVALID_REQUEST", req{Method: "GET", Path: svc(s.ServiceID, "/logs?cursor=garbage")})
			e.want(400, "INVALID_REQUEST", req{Method: "GET", Path: svc(s.ServiceID, "/logs?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z")})
		})
		t.Run("ErrUnknownService", func(t *testing.T) {
			e := e.with(t)
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: svc("abcdefghij", "")})
			e.want(404, "NOT_FOUND", req{Method: "GET", Path: svc("BAD!", "")})
			e.want(404, "NOT_FOUND", req{Method: "POST", Path: svc("abcdefghij", "/stop")})
		})
	})
}

func TestReplicaSets(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		s := e.readyService(map[string]any{"name": "primary", "environment_tag": "PROD"})
		sets := e.pa() + "/services/" + s.ServiceID + "/replicaSets"
		var r struct {
			ID, Name, Status string
			Nodes            int
			Metadata         struct{ Environment string }
		}
		e.want(202, "", req{Method: "POST", Path: sets, Body: map[string]any{"name": "reads", "cpu_millis": 1000, "memory_gbs": 4, "nodes": 2}}).decode(t, &r)
		if r.Status != "creating" || r.Nodes != 2 || r.Metadata.Environment != "PROD" || !dbcloud.IsID(r.ID) {
			t.Errorf("create replica set = %+v", r)
		}
		t.Run("Errors", func(t *testing.T) {
			e := e.with(t)
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: sets, Body: map[string]any{"name": "x", "cpu_millis": 1000, "memory_gbs": 4}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: sets, Body: map[string]any{"name": "x", "cpu_millis": 1000, "memory_gbs": 5, "nodes": 1}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: sets, Body: map[string]any{"name": "x", "cpu_millis": 1000, "memory_gbs": 4, "nodes": 0}})
			e.want(409, dbcloud.CodeQuotaExceeded, req{Method: "POST", Path: sets, Body: map[string]any{"name": "x", "cpu_millis": 1000, "memory_gbs": 4, "nodes": 11}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: sets, Body: map[string]any{"name": "x", "cpu_millis": "1000", "memory_gbs": 4, "nodes": 1}})
		})
		t.Run("AddressableAsService", func(t *testing.T) {
			e := e.with(t)
			got := e.getService(r.ID)
			if got.ForkedFrom == nil || !got.ForkedFrom.IsStandby || got.ForkedFrom.ServiceID != s.ServiceID {
				t.Errorf("replica set as service: forked_from = %+v", got.ForkedFrom)
			}
			var list []service
			e.want(200, "", req{Method: "GET", Path: e.pa() + "/services"}).decode(t, &list)
			for _, x := range list {
				if x.ServiceID == r.ID {
					t.Error("replica set is listed among services")
				}
			}
			parent := e.getService(s.ServiceID)
			if len(parent.ReadReplicaSets) != 1 || parent.ReadReplicaSets[0].ID != r.ID {
				t.Errorf("parent read_replica_sets = %+v", parent.ReadReplicaSets)
			}
			e.want(409, "CONFLICT", req{Method: "POST", Path: e.pa() + "/services/" + r.ID + "/stop"})
		})
		t.Run("Lifecycle", func(t *testing.T) {
			e := e.with(t)
			one := sets + "/" + r.ID
			resize := map[string]any{"cpu_millis": "2000", "memory_gbs": "8", "nodes": 3}
			e.want(409, dbcloud.CodeOperationInProgress, req{Method: "POST", Path: one + "/resize", Body: resize})
			e.settle(r.ID, "")
			e.want(202, "", req{Method: "POST", Path: one + "/resize", Body: resize})
			var list []struct{ ID, Status string }
			e.want(200, "", req{Method: "GET", Path: sets}).decode(t, &list)
			if len(list) != 1 || list[0].Status != "resizing" {
				t.Errorf("after resize: %+v", list)
			}
			e.settle(r.ID, "")
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: one + "/resize", Body: map[string]any{"cpu_millis": "shared", "memory_gbs": "shared"}})
			e.want(200, "", req{Method: "POST", Path: one + "/enablePooler"})
			e.settle(r.ID, "")
			// setEnvironment never removes anything (decisions.md section 5).
			e.want(200, "", req{Method: "POST", Path: one + "/setEnvironment", Body: map[string]string{"environment": "DEV"}})
			if got := e.getService(r.ID); got.Metadata.Environment != "DEV" || got.ConnectionPooler == nil {
				t.Errorf("after setEnvironment DEV: %+v", got)
			}
			e.want(200, "", req{Method: "POST", Path: one + "/disablePooler"})
			e.settle(r.ID, "")
			e.want(200, "", req{Method: "POST", Path: one + "/enablePooler"})
			e.settle(r.ID, "")
			e.want(404, "NOT_FOUND", req{Method: "DELETE", Path: sets + "/abcdefghij"})
			e.want(202, "", req{Method: "DELETE", Path: one})
			e.want(202, "", req{Method: "DELETE", Path: one})
		})
	})
}

func TestIdempotency(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		services := e.pa() + "/services"
		key := map[string]string{"Idempotency-Key": "create-1"}
		var first, second service
		e.want(202, "", req{Method: "POST", Path: services, Body: map[string]any{"name": "once"}, Header: key}).decode(t, &first)
		res := e.want(202, "", req{Method: "POST", Path: services, Body: map[string]any{"name": "once"}, Header: key})
		res.decode(t, &second)
		if res.Header.Get("Idempotent-Replayed") != "true" {
			t.Error("replay without Idempotent-Replayed: true")
		}
		if second.ServiceID != first.ServiceID {
			t.Errorf("replay gave service %s, want the first response's %s", second.ServiceID, first.ServiceID)
		}
		if first.InitialPassword == "" || second.InitialPassword != first.InitialPassword {
			t.Errorf("replay's initial_password %q, want the first response's %q", second.InitialPassword, first.InitialPassword)
		}
		var list []service
		e.want(200, "", req{Method: "GET", Path: services}).decode(t, &list)
		if len(list) != 1 {
			t.Errorf("%d services after a repeated create, want 1", len(list))
		}
		e.want(409, dbcloud.CodeIdempotencyKeyReused, req{Method: "POST", Path: services, Body: map[string]any{"name": "other"}, Header: key})
		// Another caller's key space is its own.
		e.want(202, "", req{Method: "POST", Path: "/projects/" + e.b.ProjectID + "/services", Key: e.b, Body: map[string]any{"name": "once"}, Header: key})
		e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: services, Body: map[string]any{"name": "x"}, Header: map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}})
		t.Run("CrashBetweenCommitAndResponse", func(t *testing.T) {
			e := e.with(t)
			crash := map[string]string{"Idempotency-Key": "create-crash"}
			var first, retry service
			e.want(202, "", req{Method: "POST", Path: services, Body: map[string]any{"name": "crash"}, Header: crash}).decode(t, &first)
			// What a crash after the commit and before the response leaves:
			// the change and its key, no stored response.
			err := e.store.Update(context.Background(), func(tx dbcloud.Tx) error {
				r, err := tx.FindIdempotency(e.a.AccessKey, "create-crash")
				if err != nil {
					return err
				}
				if r.Secret == nil {
					t.Error("the initial password was not sealed with the change")
				}
				r.Response, r.Status = nil, 0
				return tx.UpdateIdempotency(r)
			})
			if err != nil {
				t.Fatal(err)
			}
			e.want(202, "", req{Method: "POST", Path: services, Body: map[string]any{"name": "crash"}, Header: crash}).decode(t, &retry)
			if retry.ServiceID != first.ServiceID || retry.InitialPassword == "" || retry.InitialPassword != first.InitialPassword {
				t.Errorf("retry after the crash: service %s password %q; want %s with the first response's password", retry.ServiceID, retry.InitialPassword, first.ServiceID)
			}
		})
		// A delete replays its empty 202.
		del := map[string]string{"Idempotency-Key": "delete-1"}
		e.want(202, "", req{Method: "DELETE", Path: services + "/" + first.ServiceID, Header: del})
		if r := e.want(202, "", req{Method: "DELETE", Path: services + "/" + first.ServiceID, Header: del}); len(r.Body) != 0 {
			t.Errorf("replayed delete has body %q", r.Body)
		}
	})
}

func TestRateLimits(t *testing.T) {
	e := newEnv(t, "sqlite", http.Config{RateLimit: 1, RateBurst: 3, AuthFailLimit: 0.5, AuthFailBurst: 2})
	for range 3 {
		e.want(200, "", req{Method: "GET", Path: "/projects"})
	}
	res := e.want(429, "RATE_LIMITED", req{Method: "GET", Path: "/projects"})
	if res.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	// Another key has its own budget.
	e.want(200, "", req{Method: "GET", Path: "/projects", Key: e.b})

	bad := &cloud.NewAPIKey{AccessKey: "nobody", SecretKey: "nothing"}
	e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", Key: bad})
	e.want(401, "UNAUTHORIZED", req{Method: "GET", Path: "/projects", Key: bad})
	res = e.want(429, "RATE_LIMITED", req{Method: "GET", Path: "/projects", Key: bad})
	if res.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
}

// TestProjectIsolation: project a's key gets 404 on every path of project
// b, so b's existence and contents do not leak.
func TestProjectIsolation(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		pb := "/projects/" + e.b.ProjectID
		var svc service
		e.want(202, "", req{Method: "POST", Path: pb + "/services", Key: e.b, Body: map[string]any{"name": "b", "environment_tag": "PROD"}}).decode(t, &svc)
		var vpc, peering struct{ ID string }
		e.want(201, "", req{Method: "POST", Path: pb + "/vpcs", Key: e.b, Body: map[string]string{"name": "b", "cidr": "10.5.0.0/16", "region_code": "local"}}).decode(t, &vpc)
		e.want(201, "", req{Method: "POST", Path: pb + "/vpcs/" + vpc.ID + "/peerings", Key: e.b, Body: map[string]string{"peer_account_id": "1", "peer_region_code": "r", "peer_vpc_id": "v"}}).decode(t, &peering)
		sid := pb + "/services/" + svc.ServiceID
		body := map[string]any{"name": "x", "cidr": "10.6.0.0/16", "region_code": "local", "cpu_millis": "1000", "memory_gbs": "4",
			"vpc_id": vpc.ID, "password": "a-long-password", "environment": "DEV", "fork_strategy": "NOW",
			"peer_account_id": "2", "peer_region_code": "r", "peer_vpc_id": "w", "nodes": 1, "idle_seconds": 0}
		for _, rt := range (&http.Handler{}).Routes() {
			path := strings.NewReplacer("{project_id}", e.b.ProjectID, "{service_id}", svc.ServiceID, "{vpc_id}", vpc.ID,
				"{peering_id}", peering.ID, "{replica_set_id}", "abcdefghij").Replace(rt.Path)
			if !strings.HasPrefix(rt.Path, "/projects/{project_id}") {
				continue
			}
			var b any
			if rt.Body {
				b = body
				if strings.HasSuffix(rt.Path, "/replicaSets") {
					b = map[string]any{"name": "x", "cpu_millis": 1000, "memory_gbs": 4, "nodes": 1}
				}
			}
			res := e.do(req{Method: rt.Method, Path: path, Body: b})
			if res.Status != 404 {
				t.Errorf("%s %s with another project's key: %d, want 404", rt.Method, rt.Path, res.Status)
			}
		}
		// Nothing changed in project b.
		got := e.want(200, "", req{Method: "GET", Path: sid, Key: e.b})
		var after service
		got.decode(t, &after)
		if after.Status != "QUEUED" || after.Metadata.Environment != "PROD" {
			t.Errorf("project b's service changed: %+v", after)
		}
	})
}

// TestCompatibilityPaths: the paths of decisions.md section 1 that the
// original's clients call beyond the API document.
func TestCompatibilityPaths(t *testing.T) {
	forEachStore(t, func(t *testing.T, kind string) {
		e := newEnv(t, kind, noLimits)
		t.Run("RenameService", func(t *testing.T) {
			e := e.with(t)
			var created, renamed, got service
			e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: map[string]any{"name": "before"}}).decode(t, &created)
			path := e.pa() + "/services/" + created.ServiceID
			e.want(200, "", req{Method: "POST", Path: path + "/rename", Body: map[string]any{"name": "after"}}).decode(t, &renamed)
			if renamed.ServiceID != created.ServiceID || renamed.Name != "after" || renamed.InitialPassword != "" {
				t.Errorf("rename answered %+v, want service %s named after, without a password", renamed, created.ServiceID)
			}
			e.want(200, "", req{Method: "GET", Path: path}).decode(t, &got)
			if got.Name != "after" {
				t.Errorf("after rename GET shows name %q, want after", got.Name)
			}
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path + "/rename", Body: map[string]any{"name": ""}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path + "/rename", Body: map[string]any{"name": "a\u202eb"}})
			e.want(400, "INVALID_REQUEST", req{Method: "POST", Path: path + "/rename", Body: map[string]any{}})
			e.want(404, "NOT_FOUND", req{Method: "POST", Path: e.pa() + "/services/abcdefghij/rename", Body: map[string]any{"name": "x"}})
			if e.want(200, "", req{Method: "GET", Path: path}).decode(t, &got); got.Name != "after" {
				t.Errorf("a refused rename changed the name to %q", got.Name)
			}
		})
		t.Run("Analytics", func(t *testing.T) {
			e := e.with(t)
			for _, p := range []string{"/analytics/identify", "/analytics/track"} {
				e.want(204, "", req{Method: "POST", Path: p, Body: map[string]any{"event": "service_create", "properties": map[string]any{"os": "linux"}}})
				e.want(204, "", req{Method: "POST", Path: p})
				e.want(401, "UNAUTHORIZED", req{Method: "POST", Path: p, NoAuth: true})
			}
		})
	})
}
