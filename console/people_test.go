package console_test

import (
	stdhttp "net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"dbcloud"
)

var inviteLinkRE = regexp.MustCompile(`<code id="secret-invite-link">([^<]+)</code>`)

// TestConsoleInvitation: an owner makes an invitation; its link is shown
// once, after the redirect; a second person opens it without an account,
// is refused beside the field for a short password, then joins, signed
// in; the link used again, a wrong link and a withdrawn one each get a
// page that says so, with no form.
func TestConsoleInvitation(t *testing.T) {
	s, b, page := signedIn(t)
	pid := s.boot.Project.ID
	members := s.srv.URL + "/p/" + pid + "/members"
	csrf := csrfOf(t, page)
	invite := func(email, role string) (*stdhttp.Response, string) {
		t.Helper()
		return b.post(s.srv.URL+"/p/"+pid+"/invitations", url.Values{"csrf": {csrf}, "email": {email}, "role": {role}})
	}
	res, page := invite("not an address", "viewer")
	if res.StatusCode != 400 || !strings.Contains(page, `id="err-inv"`) || !strings.Contains(page, `value="not an address"`) {
		t.Errorf("a bad address: %d, want 400 with the error beside the field and the address kept\n%s", res.StatusCode, page)
	}
	res, page = invite("grace@example.com", "developer")
	m := inviteLinkRE.FindStringSubmatch(page)
	if res.Request.URL.Path != "/p/"+pid+"/members" || m == nil {
		t.Fatalf("invite: %d at %s, want the members page with the link\n%s", res.StatusCode, res.Request.URL, page)
	}
	link := htmlUnescape(m[1])
	if !strings.HasPrefix(link, s.srv.URL+"/invite/dbc_invite_") || !strings.Contains(page, "grace@example.com") {
		t.Errorf("link %q; page:\n%s", link, page)
	}
	if _, again := b.get(members); strings.Contains(again, link) {
		t.Error("the link is shown again on reload")
	}

	grace := s.browser()
	res, page = grace.get(link)
	if res.StatusCode != 200 || !strings.Contains(page, `id="inv-password"`) || !strings.Contains(page, "Ada Owner invites") {
		t.Fatalf("the link's page: %d\n%s", res.StatusCode, page)
	}
	form := hidden(page)
	form.Set("name", "Grace Hopper")
	form.Set("password", "short")
	form.Set("password_again", "short")
	res, page = grace.post(link, form)
	if res.StatusCode != 400 || !strings.Contains(page, `id="err-password"`) || !strings.Contains(page, `value="Grace Hopper"`) {
		t.Errorf("a short password: %d, want 400 beside the field with the name kept\n%s", res.StatusCode, page)
	}
	form.Set("password", "a long enough password")
	form.Set("password_again", "a long enough password")
	res, page = grace.post(link, form)
	if res.Request.URL.Path != "/p/"+pid+"/services" || !strings.Contains(page, "grace@example.com") || !strings.Contains(page, "· developer") {
		t.Fatalf("accept: %d at %s, want the project's services, signed in as a developer\n%s", res.StatusCode, res.Request.URL, page)
	}

	if _, page := b.get(members); !strings.Contains(page, "Grace Hopper") || strings.Contains(page, "invitation of grace@example.com") {
		t.Errorf("the members page after the join lists no member Grace, or her invitation as pending:\n%s", page)
	}
	gone := func(who *browser, u, want string, status int) {
		t.Helper()
		res, page := who.get(u)
		if res.StatusCode != status || !strings.Contains(page, want) || strings.Contains(page, `action="/invite/`) {
			t.Errorf("GET %s: %d, want %d saying %q and no form\n%s", u, res.StatusCode, status, want, page)
		}
	}
	gone(s.browser(), link, "used already", 410)
	gone(s.browser(), link+"x", "not valid", 404)
	// A form posted to a used link changes nothing.
	res, page = s.browser().post(link, form)
	if res.StatusCode != 403 && res.StatusCode != 410 {
		t.Errorf("POST to a used link: %d\n%s", res.StatusCode, page)
	}

	_, page = invite("late@example.com", "viewer")
	late := htmlUnescape(inviteLinkRE.FindStringSubmatch(page)[1])
	ids := regexp.MustCompile(`/invitations/([^/]+)/revoke`).FindStringSubmatch(page)
	if ids == nil {
		t.Fatalf("no pending invitation listed:\n%s", page)
	}
	res, page = b.post(s.srv.URL+"/p/"+pid+"/invitations/"+ids[1]+"/revoke", url.Values{"csrf": {csrf}})
	if !strings.Contains(page, "Invitation withdrawn") || strings.Contains(page, "late@example.com") {
		t.Errorf("withdraw: %d\n%s", res.StatusCode, page)
	}
	gone(s.browser(), late, "withdrawn", 410)
	_, page = invite("slow@example.com", "viewer")
	slow := htmlUnescape(inviteLinkRE.FindStringSubmatch(page)[1])
	s.advance(dbcloud.InvitationTTL + time.Minute)
	gone(s.browser(), slow, "expired", 410)
}

// TestConsoleProjectCreate: a blank name is refused beside the field with
// what was typed kept; a good one is trimmed and makes the person its
// owner; the project switch's "New project" entry opens the form.
func TestConsoleProjectCreate(t *testing.T) {
	s, b, page := signedIn(t)
	csrf := csrfOf(t, page)
	if !strings.Contains(page, `<option value="new">New project…</option>`) {
		t.Errorf("the project switch has no entry to make a project:\n%s", page)
	}
	res, _ := b.get(s.srv.URL + "/switch?project=new")
	if res.Request.URL.Path != "/projects/new" {
		t.Errorf("switch to new: at %s", res.Request.URL)
	}
	res, page = b.post(s.srv.URL+"/projects", url.Values{"csrf": {csrf}, "name": {"   "}})
	if res.StatusCode != 400 || !strings.Contains(page, `id="err-name"`) || !strings.Contains(page, `value="   "`) || !strings.Contains(page, "visible character") {
		t.Errorf("a blank name: %d, want 400 beside the field with what was typed\n%s", res.StatusCode, page)
	}
	res, page = b.post(s.srv.URL+"/projects", url.Values{"csrf": {csrf}, "name": {"  Team <B>  "}})
	if !strings.HasPrefix(res.Request.URL.Path, "/p/") || res.Request.URL.Path == "/p/"+s.boot.Project.ID+"/services" ||
		!strings.Contains(page, "Project created") || !strings.Contains(page, "selected>Team &lt;B&gt;</option>") || !strings.Contains(page, "· owner") {
		t.Errorf("create: %d at %s\n%s", res.StatusCode, res.Request.URL, page)
	}
}

// TestConsoleKeyLastUsed: the keys page says "never" for an unused key
// and when it was used after a request authenticated with it.
func TestConsoleKeyLastUsed(t *testing.T) {
	s, b, _ := signedIn(t)
	keys := s.srv.URL + "/p/" + s.boot.Project.ID + "/keys"
	if _, page := b.get(keys); !strings.Contains(page, `<td class="last-used">never</td>`) {
		t.Fatalf("an unused key:\n%s", page)
	}
	req, _ := stdhttp.NewRequest("GET", s.srv.URL+"/public/api/v1/projects", nil)
	req.SetBasicAuth(s.boot.Key.AccessKey, s.boot.Key.SecretKey)
	res, err := s.srv.Client().Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("a request with the key: %v %v", err, res)
	}
	res.Body.Close()
	want := `<td class="last-used">` + s.clock().UTC().Format("2006-01-02 15:04 UTC") + `</td>`
	if _, page := b.get(keys); !strings.Contains(page, want) {
		t.Errorf("after a use the keys page lacks %s:\n%s", want, page)
	}
}
