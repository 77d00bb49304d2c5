package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// consoleOwner reads the first owner's console sign-in from the server's
// bootstrap.json, and the console's origin.
func consoleOwner(t *testing.T, s *server) (ownerFile, string) {
	t.Helper()
	owner := s.owner()
	return owner, strings.TrimSuffix(owner.ConsoleURL, "/")
}

// chooseProject picks an entry of the header's project switch as a person
// does: the value changes and the select says so, with no click after.
// It waits for the console's script (deferred, it marks the page "js")
// first: a change before it runs is one no script saw.
func chooseProject(value string) chromedp.Action {
	var ready string
	return chromedp.Tasks{
		evalUntil(20*time.Second, `document.documentElement.classList.contains("js") ? "yes" : ""`, &ready),
		chromedp.Evaluate(`(() => { const s = document.getElementById("project-switch");
			s.value = `+jsString(value)+`; s.dispatchEvent(new Event("change", {bubbles: true})); return true; })()`, nil),
	}
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestBrowserPeople drives the console's people pages in Chromium: an API
// key's "last used" after a request with it; a project made from the
// project switch (a blank name refused beside the field, with what was
// typed kept) and the switch switching on selection; and an invitation:
// the owner copies its link, a second browser with no account opens it,
// sets a password and lands in the project as the invited role, and the
// link used again is refused.
func TestBrowserPeople(t *testing.T) {
	s := newServer(t)
	owner, origin := consoleOwner(t, s)
	ctx, shot := chrome(t)
	pid := s.boot.ProjectID
	run(t, ctx, 30*time.Second, "sign in",
		browser.SetPermission(&browser.PermissionDescriptor{Name: "clipboard-read"}, browser.PermissionSettingGranted).WithOrigin(origin),
		browser.SetPermission(&browser.PermissionDescriptor{Name: "clipboard-write"}, browser.PermissionSettingGranted).WithOrigin(origin),
		chromedp.Navigate(origin+"/"),
		chromedp.WaitVisible("#email", chromedp.ByID),
		chromedp.SendKeys("#email", owner.OwnerEmail, chromedp.ByID),
		chromedp.SendKeys("#password", owner.OwnerPassword, chromedp.ByID),
		chromedp.Submit("#password", chromedp.ByID),
		chromedp.WaitVisible("#svc-name", chromedp.ByID),
	)

	// Keys: "never" until the key authenticates a request.
	var access, secret, used string
	lastUsed := `//tr[td[1][text()="people-key"]]/td[@class="last-used"]`
	run(t, ctx, 30*time.Second, "create an API key",
		chromedp.Navigate(origin+"/p/"+pid+"/keys"),
		chromedp.SendKeys("#key-name", "people-key", chromedp.ByID),
		chromedp.Submit("#key-name", chromedp.ByID),
		chromedp.WaitVisible("#secret-secret-key", chromedp.ByID),
		chromedp.Text("#secret-access-key", &access, chromedp.ByID),
		chromedp.Text("#secret-secret-key", &secret, chromedp.ByID),
		chromedp.Text(lastUsed, &used, chromedp.BySearch),
	)
	if used != "never" {
		t.Errorf("a new key's last use: %q, want never", used)
	}
	if code := apiWithKey(t, s, access, secret); code != 200 {
		t.Fatalf("the new key: %d, want 200", code)
	}
	// Another URL than the page open, so that what is read is the new page.
	run(t, ctx, 30*time.Second, "the keys page after a use",
		chromedp.Navigate(origin+"/p/"+pid+"/keys?after=use"),
		chromedp.Text(lastUsed, &used, chromedp.BySearch),
	)
	if !strings.HasSuffix(used, " UTC") || !strings.HasPrefix(used, time.Now().UTC().Format("2006-")) {
		t.Errorf("the key's last use after a request: %q, want its time", used)
	}
	shot("keys-last-used")

	// A project, made from the switch's "New project" entry.
	var where, typed, fieldErr string
	run(t, ctx, 30*time.Second, "choose New project in the switch",
		chooseProject("new"),
		chromedp.WaitVisible("#project-name", chromedp.ByID),
		chromedp.SetValue("#project-name", "   ", chromedp.ByID),
		chromedp.Submit("#project-name", chromedp.ByID),
		chromedp.WaitVisible("#err-name", chromedp.ByID),
		chromedp.Text("#err-name", &fieldErr, chromedp.ByID),
		chromedp.Value("#project-name", &typed, chromedp.ByID),
	)
	if typed != "   " || !strings.Contains(fieldErr, "visible character") {
		t.Errorf("a blank project name: the field keeps %q, its error says %q", typed, fieldErr)
	}
	shot("project-new-error")
	var chosen string
	run(t, ctx, 30*time.Second, "create a project",
		chromedp.SetValue("#project-name", "  Browser team  ", chromedp.ByID),
		chromedp.Submit("#project-name", chromedp.ByID),
		evalUntil(20*time.Second, `(() => { const n = document.querySelector(".notice");
			return n && n.textContent.includes("Project created") ? location.pathname : ""; })()`, &where),
		chromedp.Evaluate(`(() => { const s = document.getElementById("project-switch"); return s.options[s.selectedIndex].text; })()`, &chosen),
	)
	if !strings.HasPrefix(where, "/p/") || strings.HasPrefix(where, "/p/"+pid+"/") || chosen != "Browser team" {
		t.Errorf("after create: at %s with %q chosen, want the new project's services with its name trimmed", where, chosen)
	}
	// Switching back takes the selection alone.
	run(t, ctx, 30*time.Second, "switch back on selection",
		chooseProject(pid),
		evalUntil(20*time.Second, `location.pathname === "/p/`+pid+`/services" ? "yes" : ""`, &where),
	)

	// An invitation: the owner copies the link.
	var link string
	run(t, ctx, 30*time.Second, "invite",
		chromedp.Navigate(origin+"/p/"+pid+"/members"),
		chromedp.SendKeys("#inv-email", "grace@example.com", chromedp.ByID),
		chromedp.SetValue("#inv-role", "developer", chromedp.ByID),
		chromedp.Submit("#inv-email", chromedp.ByID),
		// The link's page once loaded whole: a node found while the
		// redirect still commits may be gone when clicked.
		evalUntil(20*time.Second, `document.readyState === "complete" && document.querySelector('[data-copy="secret-invite-link"]') ? "yes" : ""`, &where),
		chromedp.WaitVisible(`[data-copy="secret-invite-link"]`, chromedp.ByQuery),
		chromedp.Click(`[data-copy="secret-invite-link"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`//button[@data-copy="secret-invite-link" and text()="Copied"]`, chromedp.BySearch),
		chromedp.Evaluate(`navigator.clipboard.readText()`, &link, func(p *runtime.EvaluateParams) *runtime.EvaluateParams {
			return p.WithAwaitPromise(true)
		}),
	)
	if !strings.HasPrefix(link, origin+"/invite/") {
		t.Fatalf("the copy button copied %q, want the invitation link", link)
	}
	shot("invitation-made")

	// A second person, in a browser of their own (no cookies of the
	// owner's; headless Chromium refuses a tab in a second browser
	// context, "no browser is open"), opens it and joins.
	gctx, _ := chrome(t)
	var who string
	run(t, gctx, 30*time.Second, "open the link",
		chromedp.Navigate(link),
		chromedp.WaitVisible("#inv-password", chromedp.ByID),
	)
	pageAtWidths(t, gctx, shot, consolePage{name: "an invitation", wait: "#inv-password"})
	run(t, gctx, 30*time.Second, "join",
		chromedp.SendKeys("#inv-name", "Grace Hopper", chromedp.ByID),
		chromedp.SendKeys("#inv-password", "a long enough password", chromedp.ByID),
		chromedp.SendKeys("#inv-again", "a long enough password", chromedp.ByID),
		chromedp.Submit("#inv-again", chromedp.ByID),
		evalUntil(20*time.Second, `(() => { const n = document.querySelector(".notice");
			return n && n.textContent.includes("Welcome") ? location.pathname : ""; })()`, &where),
		chromedp.Text("a.who", &who, chromedp.ByQuery),
	)
	if where != "/p/"+pid+"/services" || !strings.Contains(who, "grace@example.com") || !strings.Contains(who, "developer") {
		t.Errorf("after joining: at %s as %q, want the project's services as grace, a developer", where, who)
	}
	shot("invitation-joined")
	var refused string
	run(t, gctx, 30*time.Second, "the link used twice",
		chromedp.Navigate(link),
		chromedp.WaitVisible(".error", chromedp.ByQuery),
		chromedp.Text("main", &refused, chromedp.ByQuery),
	)
	var forms int
	run(t, gctx, 10*time.Second, "count its forms",
		chromedp.Evaluate(`document.querySelectorAll('main form[action^="/invite/"]').length`, &forms))
	if !strings.Contains(refused, "used already") || forms != 0 {
		t.Errorf("the link used twice shows %d forms and says:\n%s", forms, refused)
	}
	// The owner's members page: Grace a member, her invitation no longer
	// pending (read from whichever page is current once it shows both).
	var members string
	run(t, ctx, 30*time.Second, "the owner's members page after the join",
		chromedp.Navigate(origin+"/p/"+pid+"/members"),
		evalUntil(20*time.Second, `(() => { const m = document.querySelector("main");
			return m && m.textContent.includes("Grace Hopper") && !document.querySelector('form[action*="/invitations/"]') ? m.textContent : ""; })()`, &members),
	)
}
