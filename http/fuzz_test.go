package http_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	stdhttp "net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/http"
	"dbcloud/storetest"
)

// fuzzSeeds reach every route of the API (TestFuzzSeeds_CoverRoutes holds
// them to http.Handler.Routes), with bodies and query parameters both
// valid and not. A path that starts with /projects or /auth is below the
// base path; any other is below the fuzzing key's project. Placeholders
// name real resources: {pid} the key's project, {other} a project the key
// may not see, {sid} a READY PROD service, {vid} a VPC, {pcid} a peering
// of it, {rsid} a read replica set of {sid}.
var fuzzSeeds = []struct{ method, path, body string }{
	{"GET", "/auth/info", ``},
	{"POST", "/auth/logout", ``},
	{"POST", "/analytics/identify", `{"properties":{"os":"linux"}}`},
	{"POST", "/analytics/track", `{"event":"x"}`},
	{"GET", "/projects", ``},
	{"GET", "/projects/{other}/services", ``},

	{"GET", "/vpcs", ``},
	{"POST", "/vpcs", `{"name":"v","cidr":"10.0.0.0/16","region_code":"local"}`},
	{"POST", "/vpcs", `{"name":"v","cidr":"10.1.0.0/33","region_code":"nowhere"}`},
	{"GET", "/vpcs/{vid}", ``},
	{"DELETE", "/vpcs/0", ``},
	{"DELETE", "/vpcs/{vid}", ``},
	{"POST", "/vpcs/{vid}/rename", `{"name":"renamed"}`},
	{"POST", "/vpcs/{vid}/rename", `{"name":""}`},
	{"GET", "/vpcs/{vid}/peerings", ``},
	{"POST", "/vpcs/{vid}/peerings", `{"peer_account_id":"123456789012","peer_region_code":"us-east-1","peer_vpc_id":"vpc-0abc"}`},
	{"POST", "/vpcs/{vid}/peerings", `{"peer_account_id":1}`},
	{"GET", "/vpcs/{vid}/peerings/{pcid}", ``},
	{"DELETE", "/vpcs/{vid}/peerings/{pcid}", ``},

	{"GET", "/services", ``},
	{"POST", "/services", `{"name":"a","cpu_millis":"1000"}`},
	{"POST", "/services", `{"name":"a","addons":["ai"],"replica_count":1,"environment_tag":"PROD"}`},
	{"POST", "/services", `{"name":null,"addons":"ai"}`},
	{"GET", "/services/{sid}", ``},
	{"DELETE", "/services/{sid}", ``},
	{"POST", "/services/{sid}/rename", `{"name":"renamed"}`},
	{"POST", "/services/{sid}/rename", `{"name":""}`},
	{"GET", "/services/{sid}/metrics/available-series", ``},
	{"POST", "/services/{sid}/metrics/series", `{"name":"timescale_cloud_database_num_connections","from":"2026-01-01T00:00:00Z","to":"2026-01-01T01:00:00Z"}`},
	{"POST", "/services/{sid}/metrics/series", `{"name":"timescale_cloud_database_wal_bytes_total","from":"2026-01-01T00:00:00Z","to":"2026-01-01T01:00:00Z","fn":"RATE","bucket_seconds":60,"filters":[{"key":"role","value":"primary"}]}`},
	{"POST", "/services/{sid}/start", ``},
	{"POST", "/services/{sid}/stop", ``},
	{"POST", "/services/{sid}/attachToVPC", `{"vpc_id":"{vid}"}`},
	{"POST", "/services/{sid}/detachFromVPC", `{"vpc_id":"{vid}"}`},
	{"POST", "/services/{sid}/resize", `{"cpu_millis":"500","memory_gbs":"2"}`},
	{"POST", "/services/{sid}/upgrade", `{"pg_version":17,"method":"IN_PLACE"}`},
	{"POST", "/services/{sid}/upgrade", `{"pg_version":"17","method":7}`},
	{"POST", "/services/{sid}/enablePooler", ``},
	{"POST", "/services/{sid}/disablePooler", ``},
	{"POST", "/services/{sid}/forkService", `{"fork_strategy":"PITR","target_time":"2026-01-01T00:00:00Z"}`},
	{"POST", "/services/{sid}/forkService", `{"fork_strategy":"NOW","name":"f","cpu_millis":"shared"}`},
	{"POST", "/services/{sid}/updatePassword", `{"password":"\u0000\u0000\u0000\u0000\u0000\u0000\u0000\u0000"}`},
	{"POST", "/services/{sid}/setEnvironment", `{"environment":"DEV"}`},
	{"POST", "/services/{sid}/setAutoPause", `{"idle_seconds":60}`},
	{"POST", "/services/{sid}/setAutoPause", `{"idle_seconds":1e400}`},
	{"GET", "/services/{sid}/logs?node=0&since=2026-01-01T00:00:00Z&search=%00", ``},
	{"GET", "/services/{sid}/logs?cursor=abc&severities=ERROR&severities=LOG&until=2026-13-01T00:00:00Z", ``},
	{"GET", "/services/{sid}/logs?node=-1&search=a&search=b", ``},
	{"POST", "/services/{sid}/setHA", `{"replica_count":1e400}`},
	{"POST", "/services/{sid}/setHA", `{"replica_count":1,"sync_replica_count":1}`},

	{"GET", "/services/{sid}/replicaSets", ``},
	{"POST", "/services/{sid}/replicaSets", `{"name":"r","cpu_millis":500.5,"memory_gbs":2,"nodes":1}`},
	{"DELETE", "/services/{sid}/replicaSets/{rsid}", ``},
	{"POST", "/services/{sid}/replicaSets/x/resize", `[]`},
	{"POST", "/services/{sid}/replicaSets/{rsid}/resize", `{"cpu_millis":1000,"memory_gbs":4,"nodes":2}`},
	{"POST", "/services/{sid}/replicaSets/{rsid}/enablePooler", ``},
	{"POST", "/services/{sid}/replicaSets/{rsid}/disablePooler", ``},
	{"POST", "/services/{sid}/replicaSets/{rsid}/setEnvironment", `{"environment":"PROD"}`},

	{"GET", "/events?after=-1", ``},
	{"GET", "/events?after=1", ``},
	{"GET", "/operations/{sid}", ``},
	{"GET", "/services/{sid}/operations?limit=2&cursor=x", ``},
	{"GET", "/services/{sid}/replicaSets/{rsid}/operations", ``},
	{"GET", "/vpcs/{vid}/operations?limit=501", ``},
	{"GET", "/vpcs/{vid}/peerings/{pcid}/operations", ``},
	{"GET", "/services/{sid}/snapshots", ``},

	{"GET", "/services/{sid}/credentials", ``},
	{"POST", "/services/{sid}/credentials", `{"name":"agent","access":"READ_ONLY","ttl_seconds":600}`},
	{"POST", "/services/{sid}/credentials", `{"name":"w","access":"READ_WRITE","ttl_seconds":59}`},
	{"DELETE", "/services/{sid}/credentials/{sid}", ``},
}

// fuzzPath turns a fuzzed path into the request's path below the base path.
func fuzzPath(path string, names *strings.Replacer, projectID string) string {
	path = names.Replace(path)
	if strings.HasPrefix(path, "/projects") || strings.HasPrefix(path, "/auth") || strings.HasPrefix(path, "/analytics") {
		return path
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return "/projects/" + projectID + path
}

// FuzzRequestDecoding sends arbitrary bodies, paths and query strings to the
// API: whatever arrives, the answer is never a 5xx and every error carries
// the error body. Every input meets the same world (fuzzWorld.reset).
func FuzzRequestDecoding(f *testing.F) {
	e := newEnv(f, "sqlite", noLimits)
	h := http.NewHandler(e.cloud, noLimits, slog.New(slog.NewTextHandler(io.Discard, nil)))
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(e.a.AccessKey+":"+e.a.SecretKey))
	w := &fuzzWorld{e: e}
	w.reset(f)
	for _, seed := range fuzzSeeds {
		f.Add(seed.method, seed.path, seed.body)
	}
	f.Fuzz(func(t *testing.T, method, path, body string) {
		defer w.reset(t)
		switch method {
		case "GET", "POST", "DELETE":
		default:
			method = "POST"
		}
		names := w.names()
		path = fuzzPath(path, names, e.a.ProjectID)
		body = names.Replace(body)
		// The event stream answers until its client leaves: this one
		// leaves after a moment.
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		req, err := stdhttp.NewRequestWithContext(ctx, method, "https://x"+http.BasePath+path, bytes.NewReader([]byte(body)))
		if err != nil {
			return // not a URL a client could send
		}
		req.Header.Set("Authorization", auth)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", method, path, body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 {
			var eb struct{ Code, Message string }
			if json.Unmarshal(rec.Body.Bytes(), &eb) != nil || eb.Code == "" || eb.Message == "" {
				t.Fatalf("%s %s: %d without an error body: %q", method, path, rec.Code, rec.Body)
			}
		}
	})
}

// fuzzWorld is what the placeholders name: a PROD service, a VPC with a
// peering, a read replica set.
type fuzzWorld struct {
	e                    *env
	sid, vid, pcid, rsid string
}

func (w *fuzzWorld) names() *strings.Replacer {
	return strings.NewReplacer("{pid}", w.e.a.ProjectID, "{other}", w.e.b.ProjectID, "{sid}", w.sid,
		"{vid}", w.vid, "{pcid}", w.pcid, "{rsid}", w.rsid)
}

// reset plays the engine after an input, and more: pending operations
// succeed, the world's resources settle, everything else the input made
// goes, and what it deleted of the world is made again. Without it the
// fuzzer would soon meet only quota errors and resources stuck behind
// an operation in progress, and explore nothing past them.
func (w *fuzzWorld) reset(tb testing.TB) {
	e, pid := w.e, w.e.a.ProjectID
	err := e.store.Update(tb.Context(), func(tx dbcloud.Tx) error {
		if err := storetest.SucceedPending(tx, ""); err != nil {
			return err
		}
		svcs, err := tx.ListServices(pid)
		if err != nil {
			return err
		}
		for _, s := range svcs {
			if s.ID != w.sid || s.Status == dbcloud.StatusDeleting {
				if err := tx.DeleteService(pid, s.ID); err != nil {
					return err
				}
				if err := tx.ReleasePorts(s.ID); err != nil {
					return err
				}
				continue
			}
			settled := dbcloud.StatusReady
			if !s.Spec.Running {
				settled = dbcloud.StatusPaused
			}
			if s.Status == settled && s.ObservedGeneration == s.Generation {
				continue // most inputs change nothing: no write, no fsync
			}
			s.Status, s.ObservedGeneration = settled, s.Generation
			if err := tx.UpdateService(s); err != nil {
				return err
			}
		}
		sets, err := tx.ListReplicaSets(pid, "")
		if err != nil {
			return err
		}
		for _, r := range sets {
			if r.ID != w.rsid || r.Status == dbcloud.ReplicaSetDeleting {
				if err := tx.DeleteReplicaSet(pid, r.ID); err != nil {
					return err
				}
				if err := tx.ReleasePorts(r.ID); err != nil {
					return err
				}
				continue
			}
			if r.Status == dbcloud.ReplicaSetActive {
				continue
			}
			r.Status = dbcloud.ReplicaSetActive
			if err := tx.UpdateReplicaSet(r); err != nil {
				return err
			}
		}
		vpcs, err := tx.ListVPCs(pid)
		if err != nil {
			return err
		}
		for _, v := range vpcs {
			peerings, err := tx.ListPeerings(v.ID)
			if err != nil {
				return err
			}
			for _, p := range peerings {
				if v.ID != w.vid || p.ID != w.pcid {
					if err := tx.DeletePeering(v.ID, p.ID); err != nil {
						return err
					}
				}
			}
			if v.ID != w.vid {
				if err := tx.DeleteVPC(pid, v.ID); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("reset the fuzzing world: %v", err)
	}
	w.remake(tb)
}

// remake creates, through the API, the world's resources that are missing.
func (w *fuzzWorld) remake(tb testing.TB) {
	e, pid := w.e.with(tb), w.e.a.ProjectID
	var haveSvc, haveVPC, havePeering, haveSet bool
	err := e.store.View(tb.Context(), func(tx dbcloud.Tx) error {
		_, err := tx.FindService(pid, w.sid)
		haveSvc = err == nil
		_, err = tx.FindVPC(pid, w.vid)
		haveVPC = err == nil
		_, err = tx.FindPeering(w.vid, w.pcid)
		havePeering = err == nil
		_, err = tx.FindReplicaSet(pid, w.rsid)
		haveSet = err == nil
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	if !haveSvc {
		w.sid, haveSet = e.readyService(map[string]any{"name": "fuzz", "environment_tag": "PROD"}).ServiceID, false
	}
	if !haveVPC {
		var vpc struct{ ID string }
		e.want(201, "", req{Method: "POST", Path: e.pa() + "/vpcs", Body: map[string]string{"name": "fuzz", "cidr": "10.9.0.0/16", "region_code": "local"}}).decode(tb, &vpc)
		w.vid, havePeering = vpc.ID, false
	}
	if !havePeering {
		var p struct{ ID string }
		e.want(201, "", req{Method: "POST", Path: e.pa() + "/vpcs/" + w.vid + "/peerings",
			Body: map[string]string{"peer_account_id": "123456789012", "peer_region_code": "us-east-1", "peer_vpc_id": "vpc-0fuzz"}}).decode(tb, &p)
		w.pcid = p.ID
	}
	if !haveSet {
		// Refused while the service is not READY and PROD; the input after
		// the one that changed that finds no replica set.
		w.rsid = ""
		res := e.do(req{Method: "POST", Path: e.pa() + "/services/" + w.sid + "/replicaSets",
			Body: map[string]any{"name": "fuzz", "cpu_millis": 1000, "memory_gbs": 4, "nodes": 1}})
		if res.Status == 202 {
			var r struct{ ID string }
			res.decode(tb, &r)
			w.rsid = r.ID
			e.settle(r.ID, dbcloud.StatusReady) // a replica set settles active
		}
	}
}

// TestFuzzSeeds_CoverRoutes: every route of the API has a seed, so the
// fuzzer starts from each handler's path, query and body.
func TestFuzzSeeds_CoverRoutes(t *testing.T) {
	names := strings.NewReplacer("{pid}", "p", "{other}", "o", "{sid}", "s", "{vid}", "1", "{pcid}", "2", "{rsid}", "r")
	param := regexp.MustCompile(`\{[a-z_]+\}`)
	for _, rt := range (&http.Handler{}).Routes() {
		quoted := regexp.QuoteMeta(param.ReplaceAllString(rt.Path, "PARAM"))
		pattern := regexp.MustCompile("^" + strings.ReplaceAll(quoted, "PARAM", `[^/]+`) + "$")
		found := false
		for _, s := range fuzzSeeds {
			path, _, _ := strings.Cut(fuzzPath(s.path, names, "p"), "?")
			if s.method == rt.Method && pattern.MatchString(path) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("no fuzz seed for %s %s", rt.Method, rt.Path)
		}
	}
}
