package console_test

import (
	"context"
	"encoding/base64"
	stdhttp "net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"dbcloud/cloud"

	"golang.org/x/oauth2"

	"dbcloud"
	"dbcloud/http"
	"dbcloud/storetest"
)

// fakeRuntime stands in for the runtime: these tests are about the
// console's pages and security; the browser test drives the real one.
type fakeRuntime struct {
	mu        sync.Mutex
	passwords map[string]string
	roles     map[string][]dbcloud.CredentialRole
	// logQueries are the log reads asked of the runtime, in order.
	logQueries []dbcloud.LogQuery
}

func (r *fakeRuntime) SyncCredentials(_ context.Context, s *dbcloud.Service, live []dbcloud.CredentialRole) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.roles == nil {
		r.roles = map[string][]dbcloud.CredentialRole{}
	}
	r.roles[s.ID] = live
	return nil
}

func (r *fakeRuntime) CredentialLogins(context.Context, *dbcloud.Service) (map[string]time.Time, error) {
	return nil, nil
}

func (r *fakeRuntime) PGVersions() []dbcloud.PGVersion {
	return []dbcloud.PGVersion{{Major: 15, Full: "15.20", Extensions: map[string]bool{"vector": true}}}
}
func (r *fakeRuntime) PortFree(int) bool { return true }
func (r *fakeRuntime) SetPassword(_ context.Context, s *dbcloud.Service, v string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.passwords[s.ID] = v
	return nil
}
func (r *fakeRuntime) Logs(_ context.Context, _ *dbcloud.Service, q dbcloud.LogQuery) (*dbcloud.LogPage, error) {
	r.mu.Lock()
	r.logQueries = append(r.logQueries, q)
	r.mu.Unlock()
	return &dbcloud.LogPage{Entries: []dbcloud.LogEntry{{Timestamp: time.Now(), Severity: "LOG", Message: "database system is ready to accept connections"}}}, nil
}

func signedIn(t *testing.T) (*site, *browser, string) {
	t.Helper()
	s := newSite(t, &fakeRuntime{passwords: map[string]string{}})
	b := s.browser()
	_, page := b.get(s.srv.URL + "/signin")
	res, page := b.signIn(page, s.boot.User.Email, s.boot.Password)
	want := "/p/" + s.boot.Project.ID + "/services"
	if res.Request.URL.Path != want {
		t.Fatalf("after sign-in: %s %d, want %s\n%s", res.Request.URL, res.StatusCode, want, page)
	}
	return s, b, page
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in page:\n%s", page)
	}
	return m[1]
}

func TestConsoleSecurityHeadersAndCookies(t *testing.T) {
	s := newSite(t, &fakeRuntime{passwords: map[string]string{}})
	b := s.browser()
	res, page := b.get(s.srv.URL + "/signin")
	csp := res.Header.Get("Content-Security-Policy")
	if csp == "" || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP %q", csp)
	}
	if strings.Contains(page, "<script>") || strings.Contains(page, " style=") || strings.Contains(page, " onclick") {
		t.Error("the page has inline script or style")
	}
	f := hidden(page)
	f.Set("email", s.boot.User.Email)
	f.Set("password", s.boot.Password)
	b.c.CheckRedirect = func(*stdhttp.Request, []*stdhttp.Request) error { return stdhttp.ErrUseLastResponse }
	res, _ = b.post(s.srv.URL+"/signin", f)
	b.c.CheckRedirect = nil
	var session string
	for _, c := range res.Header.Values("Set-Cookie") {
		if strings.HasPrefix(c, "__Host-dbcloud_session=") {
			session = c
		}
	}
	for _, attr := range []string{"HttpOnly", "Secure", "SameSite=Lax", "Path=/"} {
		if !strings.Contains(session, attr) {
			t.Errorf("session cookie %q lacks %s", session, attr)
		}
	}
	if strings.Contains(res.Header.Get("Location"), "session") {
		t.Error("a secret in the redirect URL")
	}
}

func TestConsoleServicesAndCSRF(t *testing.T) {
	s, b, page := signedIn(t)
	pid := s.boot.Project.ID
	base := s.srv.URL + "/p/" + pid
	csrf := csrfOf(t, page)

	// No CSRF token, or a wrong one: refused, nothing made.
	for _, tok := range []string{"", "forged"} {
		res, _ := b.post(base+"/services", url.Values{"csrf": {tok}, "name": {"evil"}, "size": {"500/2"}})
		if res.StatusCode != 403 {
			t.Errorf("create with CSRF token %q: %d, want 403", tok, res.StatusCode)
		}
	}
	// The API's own error messages are shown.
	res, page := b.post(base+"/services", url.Values{"csrf": {csrf}, "name": {""}, "size": {"123/4"}})
	if res.StatusCode != 400 || !strings.Contains(page, "must contain a visible character") {
		t.Errorf("bad create: %d, want 400 with the domain's message\n%s", res.StatusCode, page)
	}
	// Post/redirect/get: the create redirects to the new service's page,
	// which shows the password once; a reload sends nothing again.
	res, page = b.post(base+"/services", url.Values{"csrf": {csrf}, "name": {"shop"}, "size": {"500/2"}, "environment": {"DEV"}})
	svcs := listServices(t, s)
	if len(svcs) != 1 {
		t.Fatalf("services after the forged and the real create: %d, want 1", len(svcs))
	}
	sid := svcs[0].Service.ID
	svc := base + "/services/" + sid
	if res.Request.Method != "GET" || res.Request.URL.String() != svc || !strings.Contains(page, "Shown once") ||
		!regexp.MustCompile(`postgresql://tsdbadmin:[^@]+@`).MatchString(page) {
		t.Fatalf("create: %d at %s %s, want the service's page with the password shown once\n%s", res.StatusCode, res.Request.Method, res.Request.URL, page)
	}
	if _, again := b.get(svc); strings.Contains(again, "Shown once") || len(listServices(t, s)) != 1 {
		t.Error("a reload of the page after the create shows the password again or makes another service")
	}
	_, page = b.get(svc)
	if regexp.MustCompile(`postgresql://tsdbadmin:`).MatchString(page) || !strings.Contains(page, "postgresql://tsdbadmin@") {
		t.Error("the service page shows a password after creation, or no connection string")
	}
	if !strings.Contains(page, `data-service-id="`+sid+`">QUEUED<`) {
		t.Errorf("the service page shows no QUEUED status\n%s", page)
	}
	settle(t, s, sid, dbcloud.StatusReady)
	for _, step := range []struct {
		action string
		form   url.Values
		want   string
		then   dbcloud.ServiceStatus
	}{
		{"stop", nil, "Stop requested", dbcloud.StatusPaused},
		{"start", nil, "Start requested", dbcloud.StatusReady},
		{"rename", url.Values{"name": {"shop2"}}, "Renamed", dbcloud.StatusReady},
		{"fork", url.Values{"strategy": {"NOW"}, "name": {"shop-fork"}}, "Fork created", dbcloud.StatusReady},
		{"password", nil, "Password changed", dbcloud.StatusReady},
		{"delete", url.Values{"confirm": {"not-the-name"}}, "to confirm its deletion", dbcloud.StatusReady},
	} {
		f := url.Values{"csrf": {csrf}}
		for k, v := range step.form {
			f[k] = v
		}
		_, page := b.post(svc+"/"+step.action, f)
		if !strings.Contains(page, step.want) {
			t.Errorf("%s: page lacks %q\n%s", step.action, step.want, page)
		}
		settle(t, s, sid, step.then)
	}
	_, page = b.get(svc + "/logs?search=ready&severity=LOG")
	if !strings.Contains(page, "ready to accept connections") {
		t.Errorf("logs page\n%s", page)
	}
	for _, v := range listServices(t, s) {
		settle(t, s, v.Service.ID, dbcloud.StatusReady)
	}
	res, page = b.post(svc+"/delete", url.Values{"csrf": {csrf}, "confirm": {"shop2"}})
	if res.Request.URL.Path != "/p/"+pid+"/services" || !strings.Contains(page, "Delete requested") {
		t.Errorf("delete: %s\n%s", res.Request.URL, page)
	}
	// Another project's pages are 404, like the API.
	res, _ = b.get(s.srv.URL + "/p/zzzzzzzzzz/services")
	if res.StatusCode != 404 {
		t.Errorf("unknown project: %d, want 404", res.StatusCode)
	}
}

// settle plays the engine's part: the service's pending operations
// succeed and it takes the status.
func settle(t *testing.T, s *site, id string, status dbcloud.ServiceStatus) {
	t.Helper()
	err := s.cloud.Store.Update(context.Background(), func(tx dbcloud.Tx) error {
		if err := storetest.SucceedPending(tx, id); err != nil {
			return err
		}
		svc, err := tx.FindService(s.boot.Project.ID, id)
		if err != nil {
			return err
		}
		svc.Status, svc.ObservedGeneration = status, svc.Generation
		return tx.UpdateService(svc)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func listServices(t *testing.T, s *site) []*cloud.ServiceView {
	t.Helper()
	p, err := s.cloud.AuthenticateToken(context.Background(), dbcloud.TokenSession, "") // never valid
	if err == nil || p != nil {
		t.Fatal("an empty token authenticated")
	}
	var out []*cloud.ServiceView
	err = s.cloud.Store.View(context.Background(), func(tx dbcloud.Tx) error {
		ss, err := tx.ListServices(s.boot.Project.ID)
		for _, x := range ss {
			out = append(out, &cloud.ServiceView{Service: x})
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestConsoleKeysMembersSignOut(t *testing.T) {
	s, b, page := signedIn(t)
	base := s.srv.URL + "/p/" + s.boot.Project.ID
	csrf := csrfOf(t, page)

	res, page := b.post(base+"/keys", url.Values{"csrf": {csrf}, "name": {"ci"}, "role": {"developer"}})
	m := regexp.MustCompile(`id="secret-access-key">([^<]+)<.*?id="secret-secret-key">([^<]+)<`).FindStringSubmatch(strings.ReplaceAll(page, "\n", " "))
	if res.Request.Method != "GET" || res.Request.URL.Path != "/p/"+s.boot.Project.ID+"/keys" || m == nil {
		t.Fatalf("create key: %d at %s %s\n%s", res.StatusCode, res.Request.Method, res.Request.URL, page)
	}
	if _, again := b.get(base + "/keys"); strings.Contains(again, m[2]) {
		t.Error("a reload of the keys page shows the secret again")
	}
	access, secret := m[1], m[2]
	api := func() int {
		req, _ := stdhttp.NewRequest("GET", s.srv.URL+http.BasePath+"/projects", nil)
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(access+":"+secret)))
		res, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if api() != 200 {
		t.Fatal("the new key does not work")
	}
	_, page = b.get(base + "/keys")
	if strings.Contains(page, secret) {
		t.Error("the key's secret is shown again")
	}
	_, page = b.post(base+"/keys/"+access+"/revoke", url.Values{"csrf": {csrf}})
	if !strings.Contains(page, "API key revoked") || api() != 401 {
		t.Errorf("revoke: key still works or no notice\n%s", page)
	}

	// Members: the user must exist; admins are added, then removed.
	if _, _, err := s.cloud.CreateUser(context.Background(), cloud.NewUser{Email: "bob@example.com", Name: "Bob"}); err != nil {
		t.Fatal(err)
	}
	_, page = b.post(base+"/members", url.Values{"csrf": {csrf}, "email": {"nobody@example.com"}, "role": {"viewer"}})
	if !strings.Contains(page, "No user with e-mail") {
		t.Errorf("unknown member: %s", page)
	}
	_, page = b.post(base+"/members", url.Values{"csrf": {csrf}, "email": {"bob@example.com"}, "role": {"admin"}})
	if !strings.Contains(page, "bob@example.com") || !strings.Contains(page, "Member saved") {
		t.Errorf("add member:\n%s", page)
	}

	// Sign out ends the session everywhere: the old cookie is dead too.
	var old *stdhttp.Cookie
	u, _ := url.Parse(s.srv.URL)
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "__Host-dbcloud_session" {
			old = c
		}
	}
	res, _ = b.post(s.srv.URL+"/signout", url.Values{"csrf": {csrf}})
	if res.Request.URL.Path != "/signin" {
		t.Fatalf("sign out went to %s", res.Request.URL)
	}
	b.c.Jar.SetCookies(u, []*stdhttp.Cookie{old})
	res, _ = b.get(base + "/services")
	if res.Request.URL.Path != "/signin" {
		t.Errorf("the signed-out cookie still opens %s", res.Request.URL)
	}
}

func TestConsoleSessionExpires(t *testing.T) {
	s, b, _ := signedIn(t)
	s.advance(8*time.Hour + time.Second)
	res, _ := b.get(s.srv.URL + "/p/" + s.boot.Project.ID + "/services")
	if res.Request.URL.Path != "/signin" {
		t.Errorf("after 8 hours: %s, want the sign-in page", res.Request.URL)
	}
}

// TestSignInSlowDown: wrong passwords for one account are slowed down
// (429, even with the right password, while its budget is spent), but a
// valid API key of the same user and address keeps working.
func TestSignInSlowDown(t *testing.T) {
	s := newSite(t, &fakeRuntime{passwords: map[string]string{}})
	b := s.browser()
	_, page := b.get(s.srv.URL + "/signin")
	var last *stdhttp.Response
	for i := 0; i < 6; i++ {
		last, page = b.signIn(page, s.boot.User.Email, "wrong password "+string(rune('a'+i)))
	}
	if last.StatusCode != 429 || last.Header.Get("Retry-After") == "" {
		t.Fatalf("6th wrong password: %d, want 429 with Retry-After", last.StatusCode)
	}
	res, page := b.signIn(page, s.boot.User.Email, s.boot.Password)
	if res.StatusCode != 429 || !strings.Contains(page, "try again in") {
		t.Fatalf("right password while slowed down: %d", res.StatusCode)
	}
	// Another account from the same address is not slowed down yet.
	if _, _, err := s.cloud.CreateUser(context.Background(), cloud.NewUser{Email: "eve@example.com", Name: "Eve", Password: "eve's long password"}); err != nil {
		t.Fatal(err)
	}
	res, _ = b.signIn(page, "eve@example.com", "eve's long password")
	if res.StatusCode != 200 {
		t.Errorf("other account: %d", res.StatusCode)
	}
	req, _ := stdhttp.NewRequest("GET", s.srv.URL+http.BasePath+"/projects", nil)
	req.Header.Set("Authorization", "Bearer "+s.boot.Key.AccessKey+":"+s.boot.Key.SecretKey)
	res, err := s.srv.Client().Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("API key during the slow-down: %v %v", res, err)
	}
}

func TestConsoleVPCs(t *testing.T) {
	s, b, page := signedIn(t)
	base := s.srv.URL + "/p/" + s.boot.Project.ID + "/vpcs"
	csrf := csrfOf(t, page)
	_, page = b.post(base, url.Values{"csrf": {csrf}, "name": {"net"}, "cidr": {"10.1.0.0/16"}, "region": {"local"}})
	if !strings.Contains(page, "VPC created") || !strings.Contains(page, "10.1.0.0/16") {
		t.Fatalf("create VPC:\n%s", page)
	}
	res, page := b.post(base, url.Values{"csrf": {csrf}, "name": {"bad"}, "cidr": {"8.8.8.0/24"}, "region": {"local"}})
	if res.StatusCode != 400 {
		t.Errorf("public CIDR: %d\n%s", res.StatusCode, page)
	}
	id := regexp.MustCompile(`/vpcs/(\d+)/peerings"`).FindStringSubmatch(page)
	if id == nil {
		t.Fatalf("no peering form:\n%s", page)
	}
	_, page = b.post(base+"/"+id[1]+"/peerings", url.Values{"csrf": {csrf}, "peer_account_id": {"acc"}, "peer_region_code": {"local"}, "peer_vpc_id": {"vpc-9"}})
	if !strings.Contains(page, "Peering change requested") || !strings.Contains(page, "vpc-9") {
		t.Errorf("create peering:\n%s", page)
	}
}

// TestSignInNextStaysHere: the page after sign-in is on this origin,
// whatever the link said.
func TestSignInNextStaysHere(t *testing.T) {
	s := newSite(t, &fakeRuntime{passwords: map[string]string{}})
	for _, next := range []string{"//evil.example/", "/\t/evil.example/", "https://evil.example/", "/\\evil.example"} {
		b := s.browser()
		_, page := b.get(s.srv.URL + "/signin?next=" + url.QueryEscape(next))
		res, _ := b.signIn(page, s.boot.User.Email, s.boot.Password)
		if !strings.HasPrefix(res.Request.URL.String(), s.srv.URL+"/") {
			t.Errorf("next=%q led to %s", next, res.Request.URL)
		}
	}
}

// TestConsoleViewer: a viewer sees the project but no forms that change it,
// and a forged change is refused by the domain with the role's message.
func TestConsoleViewer(t *testing.T) {
	s := newSite(t, &fakeRuntime{passwords: map[string]string{}})
	if _, _, err := s.cloud.CreateUser(context.Background(), cloud.NewUser{Email: "vic@example.com", Name: "Vic", Password: "vic's long password",
		ProjectID: s.boot.Project.ID, Role: "viewer"}); err != nil {
		t.Fatal(err)
	}
	b := s.browser()
	_, page := b.get(s.srv.URL + "/signin")
	res, page := b.signIn(page, "vic@example.com", "vic's long password")
	if res.StatusCode != 200 || strings.Contains(page, "Create a service") || !strings.Contains(page, "may look but not change") {
		t.Fatalf("viewer's services page: %d\n%s", res.StatusCode, page)
	}
	for _, p := range []string{"/keys", "/members", "/vpcs"} {
		_, page := b.get(s.srv.URL + "/p/" + s.boot.Project.ID + p)
		if strings.Contains(page, "Create key") || strings.Contains(page, "Save member") || strings.Contains(page, "Create VPC") {
			t.Errorf("viewer's %s page offers a change", p)
		}
	}
	res, page = b.post(s.srv.URL+"/p/"+s.boot.Project.ID+"/services", url.Values{"csrf": {csrfOf(t, page)}, "name": {"x"}, "size": {"500/2"}})
	if res.StatusCode != 403 || !strings.Contains(page, "Your role in this project is viewer") {
		t.Errorf("viewer's forged create: %d\n%s", res.StatusCode, page)
	}
}

// TestSignOutEverywhere: one button ends the other browser's session and
// the command-line login too.
func TestSignOutEverywhere(t *testing.T) {
	s, b, page := signedIn(t)
	c := s.cli(t)
	code := c.login(t, b, s)
	tok, err := c.cfg.Exchange(c.ctx, code, oauth2.VerifierOption(c.verifier))
	if err != nil {
		t.Fatal(err)
	}
	other := s.browser()
	_, p2 := other.get(s.srv.URL + "/signin")
	other.signIn(p2, s.boot.User.Email, s.boot.Password)
	res, body := b.post(s.srv.URL+"/signout/everywhere", url.Values{"csrf": {csrfOf(t, page)}})
	if res.Request.URL.Path != "/signin" {
		t.Fatalf("sign out everywhere went to %s: %d\n%s", res.Request.URL, res.StatusCode, body)
	}
	if res, _ := other.get(s.srv.URL + "/"); res.Request.URL.Path != "/signin" {
		t.Error("the other browser is still signed in")
	}
	getJSON(t, oauth2.NewClient(c.ctx, oauth2.StaticTokenSource(tok)), s.srv.URL+http.BasePath+"/projects", 401, nil)
}

// TestConsoleServiceChartsAndOperations: the service page draws the last
// hour's metrics from the history (an SVG line, no script) and lists the
// service's operations with who asked.
func TestConsoleServiceChartsAndOperations(t *testing.T) {
	s, b, page := signedIn(t)
	pid := s.boot.Project.ID
	base := s.srv.URL + "/p/" + pid
	if res, _ := b.post(base+"/services", url.Values{"csrf": {csrfOf(t, page)}, "name": {"charted"}, "size": {"500/2"}}); res.StatusCode != 200 {
		t.Fatalf("create: %d", res.StatusCode)
	}
	sid := listServices(t, s)[0].Service.ID
	settle(t, s, sid, dbcloud.StatusReady)

	_, page = b.get(base + "/services/" + sid)
	if !strings.Contains(page, "No samples in the last 1h") {
		t.Error("a service without samples: no word that there are none")
	}
	if !strings.Contains(page, "create_service") || !strings.Contains(page, "succeeded") || !strings.Contains(page, s.boot.User.Email) {
		t.Errorf("operations: no create_service, succeeded, asked by %s\n%s", s.boot.User.Email, page)
	}

	if s.cloud.History == nil {
		t.Fatal("the SQLite store keeps no metrics history")
	}
	now := s.clock()
	var samples []dbcloud.SeriesSample
	for i := range 30 {
		samples = append(samples, dbcloud.SeriesSample{ServiceID: sid, Name: dbcloud.SeriesCPUUsage,
			Labels: map[string]string{"role": "primary"}, Time: now.Add(-time.Duration(30-i) * time.Minute), Value: float64(10 * i)})
	}
	if err := s.cloud.History.Record(context.Background(), samples); err != nil {
		t.Fatal(err)
	}
	_, page = b.get(base + "/services/" + sid)
	if !strings.Contains(page, "<polyline") || !strings.Contains(page, "CPU: <strong>290 millicores</strong>") {
		t.Errorf("no CPU chart with the newest value after samples\n%s", page)
	}
	if strings.Contains(page, "<script>") {
		t.Error("an inline script on the service page")
	}
}
