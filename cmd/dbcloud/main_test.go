package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// syncBuffer collects the server's log output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// MustRunMain starts `dbcloud serve` in-process on a free port over dir.
// After the test, once every serve on dir has stopped, the operator's
// teardown removes what they made outside dir: the runtime directory
// (under /var/lib/dbcloud when PostgreSQL's OS user cannot reach dir) and,
// as root, the pool's prepared clusters with their OS users.
func MustRunMain(tb testing.TB, dir string, logs io.Writer, args ...string) *Main {
	tb.Helper()
	if _, err := os.Stat(filepath.Join(dir, "bootstrap.json")); os.IsNotExist(err) {
		// The first start on dir: registered first, this runs last.
		tb.Cleanup(func() {
			if err := runTeardown(context.Background(), []string{"--data-dir", dir}, io.Discard, io.Discard); err != nil {
				tb.Errorf("teardown of %s: %v", dir, err)
			}
		})
	}
	m := NewMain(logs)
	if err := m.ParseFlags(append([]string{"--data-dir", dir, "--listen", "127.0.0.1:0"}, args...)); err != nil {
		tb.Fatal(err)
	}
	if err := m.Run(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}

func readBootstrap(tb testing.TB, dir string) bootstrapFile {
	tb.Helper()
	path := filepath.Join(dir, "bootstrap.json")
	fi, err := os.Stat(path)
	if err != nil {
		tb.Fatalf("bootstrap.json: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		tb.Errorf("bootstrap.json mode %v, want 0600", fi.Mode().Perm())
	}
	var b bootstrapFile
	raw, _ := os.ReadFile(path)
	if err := json.Unmarshal(raw, &b); err != nil {
		tb.Fatal(err)
	}
	return b
}

// client trusts only the server's generated CA.
func client(tb testing.TB, caFile string) *http.Client {
	tb.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		tb.Fatal("no CA in", caFile)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func call(tb testing.TB, c *http.Client, method, url, access, secret, body string) (int, []byte) {
	tb.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.SetBasicAuth(access, secret)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func TestServe_Bootstrap(t *testing.T) {
	dir := t.TempDir()
	logs := &syncBuffer{}
	m := MustRunMain(t, dir, logs)
	b := readBootstrap(t, dir)
	if b.CAFile != filepath.Join(dir, "tls", "ca.pem") || b.APIURL != m.URL() {
		t.Errorf("bootstrap = %+v, want CA in %s/tls and URL %s", b, dir, m.URL())
	}
	c := client(t, b.CAFile)
	status, body := call(t, c, "GET", b.APIURL+"/auth/info", b.AccessKey, b.SecretKey, "")
	if status != 200 || !strings.Contains(string(body), b.ProjectID) {
		t.Fatalf("auth/info: %d %s", status, body)
	}
	status, body = call(t, c, "POST", b.APIURL+"/projects/"+b.ProjectID+"/vpcs", b.AccessKey, b.SecretKey,
		`{"name":"kept","cidr":"10.0.0.0/16","region_code":"local"}`)
	if status != 201 {
		t.Fatalf("create VPC: %d %s", status, body)
	}

	// The request log has one structured line per request, and no secret.
	out := logs.String()
	if strings.Contains(out, b.SecretKey) {
		t.Error("the log contains the API secret")
	}
	var line map[string]any
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `"msg":"request"`) && strings.Contains(l, "/vpcs") {
			json.Unmarshal([]byte(l), &line)
		}
	}
	for _, k := range []string{"request_id", "method", "path", "status", "duration_ms"} {
		if _, ok := line[k]; !ok {
			t.Errorf("request log line %v lacks %s", line, k)
		}
	}

	// A restart keeps the store and creates no second bootstrap.
	m.Close()
	m2 := MustRunMain(t, dir, io.Discard)
	if again := readBootstrap(t, dir); again != b {
		t.Errorf("bootstrap.json rewritten on restart: %+v", again)
	}
	status, body = call(t, client(t, m2.CAFile), "GET", m2.URL()+"/projects/"+b.ProjectID+"/vpcs", b.AccessKey, b.SecretKey, "")
	if status != 200 || !strings.Contains(string(body), "kept") {
		t.Errorf("after restart: %d %s", status, body)
	}
}

func TestAdmin(t *testing.T) {
	dir := t.TempDir()
	m := MustRunMain(t, dir, io.Discard)
	c := client(t, m.CAFile)
	ctx := context.Background()
	run := func(args ...string) []byte {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := Run(ctx, append(args, "--data-dir", dir), &out, &errOut); err != nil {
			t.Fatalf("dbcloud %v: %v\n%s", args, err, errOut.String())
		}
		return out.Bytes()
	}
	var p struct{ ID, Name string }
	json.Unmarshal(run("admin", "project", "create", "--name", "analytics", "--json"), &p)
	if len(p.ID) != 10 || p.Name != "analytics" {
		t.Fatalf("project create printed %+v", p)
	}
	var k struct {
		AccessKey string `json:"access_key"`
		SecretKey string `json:"secret_key"`
		ProjectID string `json:"project_id"`
	}
	json.Unmarshal(run("admin", "key", "create", "--project", p.ID, "--name", "ci", "--json"), &k)
	if k.AccessKey == "" || k.SecretKey == "" || k.ProjectID != p.ID {
		t.Fatalf("key create printed %+v", k)
	}
	if status, body := call(t, c, "GET", m.URL()+"/projects", k.AccessKey, k.SecretKey, ""); status != 200 || !strings.Contains(string(body), p.ID) {
		t.Fatalf("new key: %d %s", status, body)
	}
	list := run("admin", "key", "list", "--project", p.ID)
	if !strings.Contains(string(list), k.AccessKey) || strings.Contains(string(list), k.SecretKey) {
		t.Errorf("key list = %s; want the key, never the secret", list)
	}
	run("admin", "key", "revoke", "--access-key", k.AccessKey)
	if status, _ := call(t, c, "GET", m.URL()+"/projects", k.AccessKey, k.SecretKey, ""); status != 401 {
		t.Errorf("revoked key got %d, want 401", status)
	}
	if err := Run(ctx, []string{"admin", "key", "create", "--data-dir", dir, "--project", "nosuchproj", "--name", "x"}, io.Discard, io.Discard); err == nil {
		t.Error("key create for an unknown project succeeded")
	}
}

func TestFlags(t *testing.T) {
	t.Run("Env", func(t *testing.T) {
		t.Setenv("DBCLOUD_LISTEN", "127.0.0.1:9999")
		t.Setenv("DBCLOUD_QUOTA_SERVICES", "7")
		m := NewMain(io.Discard)
		if err := m.ParseFlags([]string{"--rate-limit", "5"}); err != nil {
			t.Fatal(err)
		}
		if m.Config.Listen != "127.0.0.1:9999" || m.Config.Quotas.Services != 7 || m.Config.RateLimit != 5 {
			t.Errorf("config = %+v", m.Config)
		}
	})
	t.Run("FlagBeatsEnv", func(t *testing.T) {
		t.Setenv("DBCLOUD_LISTEN", "127.0.0.1:9999")
		m := NewMain(io.Discard)
		if err := m.ParseFlags([]string{"--listen", "127.0.0.1:1234"}); err != nil || m.Config.Listen != "127.0.0.1:1234" {
			t.Errorf("listen = %q, %v", m.Config.Listen, err)
		}
	})
	t.Run("Help", func(t *testing.T) {
		var out bytes.Buffer
		m := NewMain(&out)
		m.ParseFlags([]string{"--help"})
		for _, want := range []string{"--data-dir", "DBCLOUD_DATA_DIR", "--store", "DBCLOUD_TLS_CERT"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("--help lacks %s", want)
			}
		}
	})
	t.Run("ErrInvalid", func(t *testing.T) {
		for _, args := range [][]string{
			{"--listen", "nope"}, {"--tls-cert", "x"}, {"--sizes", "1/x"}, {"--port-min", "10"}, {"--log-format", "xml"},
			{"--quota-services", "-1"}, {"--storage-image-gib", "-4"}, {"--restore-check-interval", "-1h"},
		} {
			if err := NewMain(io.Discard).ParseFlags(args); err == nil {
				t.Errorf("ParseFlags(%v) accepted", args)
			}
		}
	})
	t.Run("ErrStore", func(t *testing.T) {
		if _, err := openStore(context.Background(), t.TempDir(), "mysql://x"); err == nil {
			t.Error("a mysql store was accepted")
		}
	})
}

// TestServe_ShutdownEndsStreams: an open event stream ends when the server
// shuts down, so Close finishes without waiting out its deadline (the
// console wraps the API's handler; before, Close answered "context
// deadline exceeded" after 10 s and the stream ran until then).
//
// The console's live pages hold a stream of their own, which must end too.
func TestServe_ShutdownEndsStreams(t *testing.T) {
	dir := t.TempDir()
	m := MustRunMain(t, dir, io.Discard)
	b := readBootstrap(t, dir)
	req, _ := http.NewRequest("GET", b.APIURL+"/projects/"+b.ProjectID+"/events", nil)
	req.SetBasicAuth(b.AccessKey, b.SecretKey)
	res, err := client(t, b.CAFile).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("events: %d", res.StatusCode)
	}
	console := consoleStream(t, b)
	defer console.Body.Close()
	ended := make(chan error, 2)
	for _, body := range []io.Reader{res.Body, console.Body} {
		go func() {
			_, err := io.Copy(io.Discard, body)
			ended <- err
		}()
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close with open event streams: %v, want nil", err)
	}
	for range 2 {
		if err := <-ended; err != nil {
			t.Errorf("a stream ended with %v, want its end", err)
		}
	}
}

// consoleStream signs the first owner in to the console and opens the
// event stream a live page follows.
func consoleStream(t *testing.T, b bootstrapFile) *http.Response {
	t.Helper()
	c := client(t, b.CAFile)
	c.Jar, _ = cookiejar.New(nil)
	origin := strings.TrimSuffix(b.ConsoleURL, "/")
	res, err := c.Get(origin + "/signin")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the sign-in page:\n%s", page)
	}
	res, err = c.PostForm(origin+"/signin", url.Values{"csrf": {string(m[1])}, "email": {b.OwnerEmail}, "password": {b.OwnerPassword}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	res, err = c.Get(origin + "/p/" + b.ProjectID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		res.Body.Close()
		t.Fatalf("console events: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	return res
}
