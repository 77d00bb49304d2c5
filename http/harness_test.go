package http_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	stdhttp "net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"dbcloud/cloud"
	"dbcloud/history"

	"github.com/getkin/kin-openapi/routers"

	"dbcloud"
	"dbcloud/http"
	"dbcloud/internal/pgtest"
	"dbcloud/postgres"
	"dbcloud/sqlite"
	"dbcloud/storetest"
)

// pg is one throwaway PostgreSQL server for the package; each test gets a
// fresh database on it.
var pg struct {
	once sync.Once
	srv  *pgtest.Server
	dir  string
	err  error
	n    int
	mu   sync.Mutex
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pg.srv != nil {
		pg.srv.Stop()
		os.RemoveAll(pg.dir)
	}
	os.Exit(code)
}

// storeKinds are the stores every API test runs against.
var storeKinds = []string{"sqlite", "postgres"}

func openStore(t testing.TB, kind string) dbcloud.Store {
	t.Helper()
	s, _ := openStoreDSN(t, kind)
	return s
}

// openStoreDSN is openStore that also returns where the store is (a file
// or a PostgreSQL DSN), so that a test can open a second handle on it.
func openStoreDSN(t testing.TB, kind string) (s dbcloud.Store, dsn string) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch kind {
	case "sqlite":
		dsn = filepath.Join(t.TempDir(), "dbcloud.db")
		s, err = sqlite.Open(ctx, dsn)
	case "postgres":
		pg.once.Do(func() {
			if pg.dir, pg.err = os.MkdirTemp("", "dbcloud-http-pg-"); pg.err == nil {
				pg.srv, pg.err = pgtest.Start(ctx, pg.dir)
			}
		})
		if pg.err != nil {
			t.Fatalf("start PostgreSQL: %v", pg.err)
		}
		pg.mu.Lock()
		pg.n++
		name := fmt.Sprintf("http_test_%d", pg.n)
		pg.mu.Unlock()
		var derr error
		if dsn, derr = pg.srv.CreateDatabase(ctx, name); derr != nil {
			t.Fatalf("create database: %v", derr)
		}
		s, err = postgres.Open(ctx, dsn)
	}
	if err != nil {
		t.Fatalf("open %s store: %v", kind, err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dsn
}

// testRuntime stands in for the runtime in these HTTP tests, which are
// about the contract; the runtime has its own end-to-end tests.
type testRuntime struct {
	mu        sync.Mutex
	passwords map[string]string
	// host is what HostCapacity reports; nil reports a host too large to
	// matter.
	host *dbcloud.HostCapacity
	// setPassword, portFree and hostCheck, when set, replace or precede
	// what the methods do.
	setPassword func(ctx context.Context, s *dbcloud.Service, verifier string) error
	portFree    func(port int) bool
	hostCheck   func()
	// roles is each service's credential roles as last synced.
	roles map[string][]dbcloud.CredentialRole
}

func (r *testRuntime) HostCapacity() (dbcloud.HostCapacity, error) {
	if r.hostCheck != nil {
		r.hostCheck()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.host != nil {
		return *r.host, nil
	}
	return dbcloud.HostCapacity{CPUMillis: 1 << 20, MemoryBytes: 1 << 50, Overcommit: 1, DiskFreeBytes: 1 << 50}, nil
}

// PGVersions are two, so that choosing one is tested; each has the ai
// addon's extension, and only 15 the time-series addon's, so that an
// upgrade of a service using it has no build to move to.
func (r *testRuntime) PGVersions() []dbcloud.PGVersion {
	return []dbcloud.PGVersion{
		{Major: 15, Full: "15.20", Extensions: map[string]bool{"vector": true, "timescaledb": true}},
		{Major: 17, Full: "17.12", Extensions: map[string]bool{"vector": true}},
	}
}

// UpgradeInPlace makes the test runtime an Upgrader; without an engine
// these tests never call it.
func (r *testRuntime) UpgradeInPlace(context.Context, *dbcloud.Service, func(dbcloud.UpgradeStep)) (string, error) {
	return "", errors.New("not in API tests")
}

// The test runtime is a BlueGreenUpgrader too; without an engine these
// tests never call it.
func (r *testRuntime) UpgradeBlueGreen(context.Context, *dbcloud.Service, func(dbcloud.UpgradeStep)) (string, error) {
	return "", errors.New("not in API tests")
}

func (r *testRuntime) RollBackUpgrade(context.Context, *dbcloud.Service, func(dbcloud.UpgradeStep)) (string, error) {
	return "", errors.New("not in API tests")
}

func (r *testRuntime) RemoveKeptCluster(context.Context, *dbcloud.Service) error {
	return errors.New("not in API tests")
}

func (r *testRuntime) PortFree(p int) bool {
	if r.portFree != nil {
		return r.portFree(p)
	}
	return true
}
func (r *testRuntime) SetPassword(ctx context.Context, s *dbcloud.Service, v string) error {
	if r.setPassword != nil {
		return r.setPassword(ctx, s, v)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.passwords[s.ID] = v
	return nil
}
func (r *testRuntime) SyncCredentials(_ context.Context, s *dbcloud.Service, live []dbcloud.CredentialRole) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.roles == nil {
		r.roles = map[string][]dbcloud.CredentialRole{}
	}
	r.roles[s.ID] = live
	return nil
}
func (r *testRuntime) CredentialLogins(context.Context, *dbcloud.Service) (map[string]time.Time, error) {
	return nil, nil
}
func (r *testRuntime) Logs(_ context.Context, _ *dbcloud.Service, q dbcloud.LogQuery) (*dbcloud.LogPage, error) {
	if q.Cursor != "" {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "cursor %q is not valid.", q.Cursor)
	}
	return &dbcloud.LogPage{}, nil
}

// env is a running API over HTTPS with two projects and a key for each.
type env struct {
	t       testing.TB
	store   dbcloud.Store
	cloud   *cloud.Cloud
	runtime *testRuntime
	srv     *httptest.Server
	router  routers.Router
	a, b    *cloud.NewAPIKey
	// dsn is where the store is (openStoreDSN).
	dsn string
}

func newEnv(t testing.TB, kind string, cfg http.Config) *env {
	t.Helper()
	e := &env{t: t, runtime: &testRuntime{passwords: map[string]string{}}}
	e.store, e.dsn = openStoreDSN(t, kind)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// As dbcloud serve opens the store: changes are recorded as events.
	e.cloud = cloud.New(history.NewEventStore(e.store), e.runtime, cloud.DefaultConfig(), logger)
	ctx := context.Background()
	boot, err := e.cloud.Bootstrap(ctx, "admin", "admin@example.com")
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	e.a = boot.Key
	pb, err := e.cloud.CreateProject(ctx, "other", "admin", "admin@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if e.b, err = e.cloud.CreateAPIKey(ctx, pb.ID, "other key", "admin", "admin@example.com"); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewUnstartedServer(http.NewHandler(e.cloud, cfg, logger))
	e.srv.StartTLS()
	t.Cleanup(e.srv.Close)
	_, e.router = loadContract(t, e.srv.URL+http.BasePath)
	return e
}

// with returns the env reporting to t, for use inside subtests.
func (e *env) with(t testing.TB) *env {
	c := *e
	c.t = t
	return &c
}

// noLimits disables rate limits for tests that are not about them.
var noLimits = http.Config{}

type resp struct {
	Status int
	Header stdhttp.Header
	Body   []byte
}

func (r *resp) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
}

func (r *resp) code(t testing.TB) string {
	t.Helper()
	var e struct{ Code string }
	json.Unmarshal(r.Body, &e)
	return e.Code
}

// req is one call. Body is JSON-encoded unless it is a string or []byte.
type req struct {
	Method, Path string
	Body         any
	Key          *cloud.NewAPIKey
	Header       map[string]string
	// NoAuth sends no Authorization header.
	NoAuth bool
	// Bearer, when set, is sent as a user's OAuth access token instead of a key.
	Bearer string
}

// do sends r with key a unless r says otherwise, and checks the exchange
// against the contract.
func (e *env) do(r req) *resp {
	e.t.Helper()
	var body []byte
	switch b := r.Body.(type) {
	case nil:
	case string:
		body = []byte(b)
	case []byte:
		body = b
	default:
		body, _ = json.Marshal(b)
	}
	hr, err := stdhttp.NewRequest(r.Method, e.srv.URL+http.BasePath+r.Path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	key := r.Key
	if key == nil {
		key = e.a
	}
	if r.Bearer != "" {
		hr.Header.Set("Authorization", "Bearer "+r.Bearer)
	} else if !r.NoAuth {
		hr.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(key.AccessKey+":"+key.SecretKey)))
	}
	for k, v := range r.Header {
		hr.Header.Set(k, v)
	}
	res, err := e.srv.Client().Do(hr)
	if err != nil {
		e.t.Fatalf("%s %s: %v", r.Method, r.Path, err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	check, _ := stdhttp.NewRequest(r.Method, e.srv.URL+http.BasePath+r.Path, bytes.NewReader(body))
	check.Header = hr.Header.Clone()
	checkExchange(e.t, e.router, check, body, res.StatusCode, res.Header, out)
	if res.Header.Get("X-Request-Id") == "" {
		e.t.Errorf("%s %s: no X-Request-Id", r.Method, r.Path)
	}
	return &resp{Status: res.StatusCode, Header: res.Header, Body: out}
}

// want sends r and fails the test unless the status (and code, if given) match.
func (e *env) want(status int, code string, r req) *resp {
	e.t.Helper()
	res := e.do(r)
	if res.Status != status {
		e.t.Fatalf("%s %s: status %d, want %d; body %s", r.Method, r.Path, res.Status, status, res.Body)
	}
	if code != "" && res.code(e.t) != code {
		e.t.Fatalf("%s %s: code %q, want %q; body %s", r.Method, r.Path, res.code(e.t), code, res.Body)
	}
	return res
}

func (e *env) pa() string { return "/projects/" + e.a.ProjectID }

// service is the subset of the Service JSON the tests read.
type service struct {
	ServiceID       string `json:"service_id"`
	Name            string `json:"name"`
	Status          string `json:"status"`
	ServiceType     string `json:"service_type"`
	RegionCode      string `json:"region_code"`
	InitialPassword string `json:"initial_password"`
	Endpoint        *struct {
		Host string `json:"host"`
		Port int    `json:"port"`
	} `json:"endpoint"`
	Resources []struct {
		ID   string `json:"id"`
		Spec struct {
			CPUMillis *int `json:"cpu_millis"`
			MemoryGBs *int `json:"memory_gbs"`
		} `json:"spec"`
	} `json:"resources"`
	HAReplicas *struct {
		ReplicaCount     int `json:"replica_count"`
		SyncReplicaCount int `json:"sync_replica_count"`
	} `json:"ha_replicas"`
	ForkedFrom *struct {
		IsStandby bool   `json:"is_standby"`
		ServiceID string `json:"service_id"`
	} `json:"forked_from"`
	Metadata struct {
		Environment   string `json:"environment"`
		PGVersion     int    `json:"pg_version"`
		PGVersionFull string `json:"pg_version_full"`
	} `json:"metadata"`
	ConnectionPooler *struct{} `json:"connection_pooler"`
	ReadReplicaSets  []struct {
		ID string `json:"id"`
	} `json:"read_replica_sets"`
}

// createService creates a service in project a and returns it.
func (e *env) createService(body map[string]any) service {
	e.t.Helper()
	var s service
	e.want(202, "", req{Method: "POST", Path: e.pa() + "/services", Body: body}).decode(e.t, &s)
	return s
}

// settle plays the engine's part for tests of the API alone: the pending
// operations of the resource succeed and the service takes status.
func (e *env) settle(id string, status dbcloud.ServiceStatus) {
	e.t.Helper()
	err := e.cloud.Store.Update(context.Background(), func(tx dbcloud.Tx) error {
		if err := storetest.SucceedPending(tx, id); err != nil {
			return err
		}
		if s, err := tx.FindService(e.a.ProjectID, id); err == nil {
			s.Status = status
			s.ObservedGeneration = s.Generation
			return tx.UpdateService(s)
		}
		r, err := tx.FindReplicaSet(e.a.ProjectID, id)
		if err != nil {
			return err
		}
		r.Status = dbcloud.ReplicaSetActive
		return tx.UpdateReplicaSet(r)
	})
	if err != nil {
		e.t.Fatalf("settle %s: %v", id, err)
	}
}

// readyService creates a service and settles it READY.
func (e *env) readyService(body map[string]any) service {
	e.t.Helper()
	s := e.createService(body)
	e.settle(s.ServiceID, dbcloud.StatusReady)
	return s
}

func (e *env) getService(id string) service {
	e.t.Helper()
	var s service
	e.want(200, "", req{Method: "GET", Path: e.pa() + "/services/" + id}).decode(e.t, &s)
	return s
}
