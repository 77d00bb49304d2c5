package console_test

import (
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"dbcloud"
)

// TestConsoleCredentials: the service's Credentials tab makes a
// credential and shows its connection string (with the password) once,
// lists it afterwards without any secret, and revokes it.
func TestConsoleCredentials(t *testing.T) {
	s, b, page := signedIn(t)
	pid := s.boot.Project.ID
	csrf := csrfOf(t, page)
	_, page = b.post(s.srv.URL+"/p/"+pid+"/services", url.Values{"csrf": {csrf}, "name": {"shop"}, "size": {"500/2"}})
	sid := listServices(t, s)[0].Service.ID
	settle(t, s, sid, dbcloud.StatusReady)
	svc := s.srv.URL + "/p/" + pid + "/services/" + sid
	if _, page = b.get(svc); !strings.Contains(page, `href="/p/`+pid+`/services/`+sid+`/credentials"`) {
		t.Fatalf("the service page has no Credentials tab\n%s", page)
	}
	_, page = b.get(svc + "/credentials")
	if !strings.Contains(page, "No credentials.") || !strings.Contains(page, "Make credential") {
		t.Fatalf("empty credentials page\n%s", page)
	}

	res, page := b.post(svc+"/credentials", url.Values{"csrf": {csrf}, "name": {"grafana"}, "access": {"READ_ONLY"}, "ttl_seconds": {"3600"}})
	conn := regexp.MustCompile(`postgresql://(dbcloud_cred_[a-z0-9]+):([^@"]+)@[^"]+/tsdb\?sslmode=require`).FindStringSubmatch(page)
	if res.Request.Method != "GET" || res.Request.URL.Path != "/p/"+pid+"/services/"+sid+"/credentials" || conn == nil || !strings.Contains(page, "shown only now") {
		t.Fatalf("make: %d, want the connection string with its password shown once\n%s", res.StatusCode, page)
	}
	user, password := conn[1], conn[2]
	if roles := rolesOf(s, sid); len(roles) != 1 || roles[0].Username != user || !roles[0].ReadOnly {
		t.Errorf("runtime roles %+v", roles)
	}
	_, page = b.get(svc + "/credentials")
	if !strings.Contains(page, "grafana") || !strings.Contains(page, user) || strings.Contains(page, password) {
		t.Errorf("the list lacks the credential or shows its password\n%s", page)
	}

	// Bad input: the domain's message, nothing made.
	res, page = b.post(svc+"/credentials", url.Values{"csrf": {csrf}, "name": {""}, "access": {"READ_ONLY"}, "ttl_seconds": {"3600"}})
	if res.StatusCode != 400 || !strings.Contains(page, "must contain a visible character") {
		t.Errorf("bad make: %d\n%s", res.StatusCode, page)
	}

	id := regexp.MustCompile(`/credentials/([a-z0-9]+)/revoke`).FindStringSubmatch(page)
	if id == nil {
		t.Fatalf("no revoke form\n%s", page)
	}
	_, page = b.post(svc+"/credentials/"+id[1]+"/revoke", url.Values{"csrf": {csrf}})
	if !strings.Contains(page, "Credential revoked") || strings.Contains(page, "grafana") {
		t.Errorf("after revoke\n%s", page)
	}
	if roles := rolesOf(s, sid); len(roles) != 0 {
		t.Errorf("runtime roles after revoke: %+v", roles)
	}
}

// rolesOf is what the fake runtime holds of the service's roles.
func rolesOf(s *site, sid string) []dbcloud.CredentialRole {
	rt := s.cloud.Runtime.(*fakeRuntime)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.roles[sid]
}

// TestConsoleDashboardLink: the link the original's CLI prints for a
// service leads to its page; an unknown ID is a 404 that says so.
func TestConsoleDashboardLink(t *testing.T) {
	s, b, page := signedIn(t)
	pid := s.boot.Project.ID
	b.post(s.srv.URL+"/p/"+pid+"/services", url.Values{"csrf": {csrfOf(t, page)}, "name": {"shop"}, "size": {"500/2"}})
	sid := listServices(t, s)[0].Service.ID
	res, page := b.get(s.srv.URL + "/dashboard/services/" + sid)
	if res.Request.URL.Path != "/p/"+pid+"/services/"+sid || !strings.Contains(page, "shop") {
		t.Errorf("the CLI's link led to %s (%d)", res.Request.URL, res.StatusCode)
	}
	res, page = b.get(s.srv.URL + "/dashboard/services/zzzzzzzzzz")
	if res.StatusCode != 404 || !strings.Contains(page, "None of your projects") {
		t.Errorf("unknown service: %d\n%s", res.StatusCode, page)
	}
}

// testCAPEM stands for the installation's CA in these tests.
const testCAPEM = "-----BEGIN CERTIFICATE-----\nMIIBdGVzdA==\n-----END CERTIFICATE-----\n"

// TestConsoleConnect: a service's Connect tab gives psql, JDBC, pgx,
// psycopg and node-pg snippets for its endpoint with verify-full and the
// CA, which downloads from /ca.pem.
func TestConsoleConnect(t *testing.T) {
	s, b, page := signedIn(t)
	pid := s.boot.Project.ID
	b.post(s.srv.URL+"/p/"+pid+"/services", url.Values{"csrf": {csrfOf(t, page)}, "name": {"shop"}, "size": {"500/2"}})
	v := listServices(t, s)[0]
	settle(t, s, v.Service.ID, dbcloud.StatusReady)
	svc := s.srv.URL + "/p/" + pid + "/services/" + v.Service.ID
	if _, page = b.get(svc); !strings.Contains(page, `href="/p/`+pid+`/services/`+v.Service.ID+`/connect"`) {
		t.Fatal("the service page has no Connect tab")
	}
	_, page = b.get(svc + "/connect")
	hostPort := v.Service.Endpoint.Host + ":" + strconv.Itoa(v.Service.Endpoint.Port)
	for _, want := range []string{
		`psql "postgresql://tsdbadmin@` + hostPort + `/tsdb?sslmode=verify-full&amp;sslrootcert=dbcloud-ca.pem"`,
		"jdbc:postgresql://" + hostPort + "/tsdb?", "pgx.Connect(", "psycopg.connect(", "new pg.Client(", `href="/ca.pem"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the Connect tab lacks %q", want)
		}
	}
	res, ca := b.get(s.srv.URL + "/ca.pem")
	if res.StatusCode != 200 || ca != testCAPEM || !strings.Contains(res.Header.Get("Content-Disposition"), "dbcloud-ca.pem") {
		t.Errorf("/ca.pem: %d %q %q", res.StatusCode, res.Header.Get("Content-Disposition"), ca)
	}
}
