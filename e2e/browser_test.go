package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"golang.org/x/oauth2"

	"dbcloud/console"
	"dbcloud/oauth"
)

// chrome starts headless Chromium (Debian's chromium package, installed by
// scripts/deps.sh) and returns a tab. The server's certificate comes from
// its own CA, which this throwaway profile does not trust; the test trusts
// it the way the other e2e tests do, by being the test.
func chrome(t *testing.T) (context.Context, func(name string)) {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed; scripts/deps.sh installs it (apt-get install chromium)")
	}
	// The profile is removed by hand after Chromium has gone: its helper
	// processes may still write for a moment after the browser exits,
	// which t.TempDir's cleanup reports as a failure.
	profile, err := os.MkdirTemp("", "dbcloud-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(profile),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("ignore-certificate-errors", true),
		chromedp.WindowSize(1280, 900),
	}
	// One deadline over the whole browser session, so that a step with no
	// deadline of its own (starting Chromium, a screenshot) fails rather
	// than hangs.
	life, cancelL := context.WithTimeout(context.Background(), 8*time.Minute)
	actx, cancelA := chromedp.NewExecAllocator(life, opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelC()
		cancelA()
		cancelL()
		for deadline := time.Now().Add(10 * time.Second); os.RemoveAll(profile) != nil && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	// The console asks before it destroys anything; the user says yes.
	chromedp.ListenTarget(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			go chromedp.Run(ctx, page.HandleJavaScriptDialog(true))
		}
	})
	dir := os.Getenv("DBCLOUD_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	// Screenshots are for the docs, so a slow one is logged, not failed;
	// each has its own deadline (Chromium's beyond-the-viewport capture
	// can stall, so only the 1280x900 viewport is taken).
	shot := func(name string) {
		var png []byte
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Run(sctx, chromedp.CaptureScreenshot(&png)); err != nil {
			t.Logf("screenshot %s: %v", name, err)
			return
		}
		if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return ctx, shot
}

// run runs browser actions with a deadline, failing the test with what
// the page showed.
func run(t *testing.T, ctx context.Context, within time.Duration, what string, actions ...chromedp.Action) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if err := chromedp.Run(c, actions...); err != nil {
		var body string
		chromedp.Run(ctx, chromedp.Text("main", &body, chromedp.ByQuery))
		t.Fatalf("%s: %v\npage: %s", what, err, body)
	}
}

type ownerFile struct {
	ConsoleURL    string `json:"console_url"`
	OwnerEmail    string `json:"owner_email"`
	OwnerPassword string `json:"owner_password"`
}

// owner reads the first owner's console sign-in from bootstrap.json.
func (s *server) owner() ownerFile {
	s.t.Helper()
	var owner ownerFile
	raw, _ := os.ReadFile(filepath.Join(s.dir, "bootstrap.json"))
	if err := json.Unmarshal(raw, &owner); err != nil || owner.OwnerPassword == "" {
		s.t.Fatalf("bootstrap.json has no owner sign-in: %s", raw)
	}
	return owner
}

// evalUntil evaluates expr, a string-valued expression, until it gives a
// non-empty string or within passes. An evaluation cut short by a
// navigation is retried, so it can follow a form's submit.
func evalUntil(within time.Duration, expr string, out *string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		deadline := time.Now().Add(within)
		for {
			err := chromedp.Evaluate(expr, out).Do(ctx)
			if err == nil && *out != "" {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: nothing within %s (last error %v)", expr, within, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

// TestBrowserConsole drives the console in headless Chromium as a person
// would: sign in with the first owner's password from bootstrap.json,
// create a service and watch it become READY, copy its connection string
// and connect with it, fork it, read its logs, approve a command-line
// client's OAuth login, create and revoke an API key, and sign out.
func TestBrowserConsole(t *testing.T) {
	s := newServer(t)
	owner, origin := consoleOwner(t, s)
	ctx, shot := chrome(t)
	pid := s.boot.ProjectID

	// Sign in.
	run(t, ctx, 30*time.Second, "sign in",
		browser.SetPermission(&browser.PermissionDescriptor{Name: "clipboard-read"}, browser.PermissionSettingGranted).WithOrigin(origin),
		browser.SetPermission(&browser.PermissionDescriptor{Name: "clipboard-write"}, browser.PermissionSettingGranted).WithOrigin(origin),
		chromedp.Navigate(origin+"/"),
		chromedp.WaitVisible("#email", chromedp.ByID),
		chromedp.ActionFunc(func(context.Context) error { shot("signin"); return nil }),
	)
	pageAtWidths(t, ctx, shot, consolePage{name: "sign-in", wait: "#email", shot: "signin"})
	run(t, ctx, 30*time.Second, "sign in",
		chromedp.SendKeys("#email", owner.OwnerEmail, chromedp.ByID),
		chromedp.SendKeys("#password", owner.OwnerPassword, chromedp.ByID),
		chromedp.Submit("#password", chromedp.ByID),
		chromedp.WaitVisible("#svc-name", chromedp.ByID),
	)

	// Create a service; its password and connection string are shown once.
	var conn string
	run(t, ctx, 60*time.Second, "create a service",
		chromedp.SendKeys("#svc-name", "browser-shop", chromedp.ByID),
		chromedp.Submit("#svc-name", chromedp.ByID),
		chromedp.WaitVisible(`[data-copy="secret-conn"]`, chromedp.ByQuery),
		chromedp.Click(`[data-copy="secret-conn"]`, chromedp.ByQuery),
		// The button says Copied once the clipboard holds the text.
		chromedp.WaitVisible(`//button[@data-copy="secret-conn" and text()="Copied"]`, chromedp.BySearch),
		chromedp.Evaluate(`navigator.clipboard.readText()`, &conn, func(p *runtime.EvaluateParams) *runtime.EvaluateParams {
			return p.WithAwaitPromise(true)
		}),
		chromedp.ActionFunc(func(context.Context) error { shot("service-created"); return nil }),
	)
	pageAtWidths(t, ctx, shot, consolePage{name: "a new service, its password shown once", wait: "#secret-conn"})
	if !strings.HasPrefix(conn, "postgresql://tsdbadmin:") {
		t.Fatalf("the copy button copied %q, want the connection string with the password", conn)
	}
	var sid string
	run(t, ctx, 10*time.Second, "read the service id",
		chromedp.Evaluate(`document.querySelector("[data-service-id]").dataset.serviceId`, &sid))
	// A reload of the page the create redirected to sends no form again.
	run(t, ctx, 30*time.Second, "reload after the create",
		chromedp.Reload(),
		chromedp.WaitVisible("[data-service-id]", chromedp.ByQuery),
	)
	var listed []service
	s.call("GET", s.services(), nil, &listed)
	if len(listed) != 1 {
		t.Fatalf("after a create and a reload the project has %d services, want 1", len(listed))
	}

	// Watch it become READY on the services list (the status cells update
	// themselves).
	run(t, ctx, 3*time.Minute, "service becomes READY",
		chromedp.Navigate(origin+"/p/"+pid+"/services"),
		chromedp.WaitVisible(`td.status-READY`, chromedp.ByQuery),
	)
	shot("services")

	// Connect with the copied string.
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pg, err := pgx.Connect(cctx, conn)
	if err != nil {
		t.Fatalf("connect with the copied connection string: %v", err)
	}
	var one int
	if err := pg.QueryRow(cctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: %v", err)
	}
	pg.Close(cctx)

	// The service page, then a fork of it, which becomes READY.
	svcURL := origin + "/p/" + pid + "/services/" + sid
	run(t, ctx, 30*time.Second, "open the service page",
		chromedp.Navigate(svcURL),
		chromedp.WaitVisible("#conn", chromedp.ByID),
	)
	shot("service")
	var forkID string
	run(t, ctx, 60*time.Second, "fork the service",
		chromedp.SetValue("#fork-strategy", "NOW", chromedp.ByID),
		chromedp.Submit("#fork-name", chromedp.ByID),
		chromedp.WaitVisible(`[data-copy="secret-conn"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector("[data-service-id]").dataset.serviceId`, &forkID),
	)
	if forkID == sid {
		t.Fatal("the fork page shows the parent")
	}
	run(t, ctx, 4*time.Minute, "fork becomes READY",
		chromedp.Navigate(origin+"/p/"+pid+"/services/"+forkID),
		chromedp.WaitVisible(`dd.status-READY`, chromedp.ByQuery),
	)
	shot("fork")
	testLivePages(t, ctx, s, origin, forkID)

	// Logs of the first service, with search.
	var logs string
	run(t, ctx, 30*time.Second, "read logs",
		chromedp.Navigate(svcURL+"/logs"),
		chromedp.WaitVisible("#log-search", chromedp.ByID),
		chromedp.SendKeys("#log-search", "ready to accept connections", chromedp.ByID),
		chromedp.Submit("#log-search", chromedp.ByID),
		// The submit navigates, and the live tail may redraw the lines, so
		// a node found before either can vanish: read the text from
		// whichever page is current once it is the searched one.
		evalUntil(20*time.Second, `(() => {
			const p = document.querySelector("pre.logs");
			return location.search.includes("search=") && p ? p.textContent : "";
		})()`, &logs),
	)
	if !strings.Contains(logs, "ready to accept connections") {
		t.Errorf("logs page shows %q", logs)
	}
	shot("logs")
	testLogsTail(t, ctx, svcURL, conn)

	// Charts: a range chosen by its link, both axes labelled, and each
	// point's value on hover (its SVG title), once the first samples are in.
	var chart string
	run(t, ctx, 3*time.Minute, "the service's charts over 24 h",
		chromedp.Navigate(svcURL),
		chromedp.Click(`//nav[@aria-label="Metrics range"]/a[text()="24h"]`, chromedp.BySearch),
		evalUntil(2*time.Minute, `(() => {
			if (!location.search.includes("range=24h")) return "";
			const f = document.querySelector("figure.chart svg");
			const cur = document.querySelector('nav.ranges a[aria-current="true"]');
			const dot = f && f.querySelector("circle title");
			// No samples yet: look again once this page has been up 2 s.
			if (!dot || !cur) { if (performance.now() > 2000) location.reload(); return ""; }
			return cur.textContent + "|" + f.querySelectorAll(".axis text").length + "|" + dot.textContent;
		})()`, &chart),
	)
	if parts := strings.Split(chart, "|"); len(parts) != 3 || parts[0] != "24h" || parts[1] == "0" || parts[2] == "" {
		t.Errorf("the charts over 24 h: range, axis labels, a point's value = %q", chart)
	}

	// Snapshots: the first one (taken once the service is READY), the
	// recovery window, and a fork from it.
	s.waitSnapshot(sid, time.Time{}, 2*time.Minute)
	var snaps string
	// The snapshot's files are there before the service's record of it,
	// and the tab is not live: it is read again until it shows one.
	run(t, ctx, 30*time.Second, "the snapshots tab",
		chromedp.Navigate(svcURL+"/snapshots"),
		evalUntil(25*time.Second, `(() => {
			if ([...document.querySelectorAll('section[aria-labelledby="h-snaps"] button')].some(b => b.textContent === "Fork from here")) return document.querySelector("main").innerText;
			if (performance.now() > 1000) location.reload();
			return "";
		})()`, &snaps),
	)
	if !strings.Contains(snaps, "Recovery window") || !strings.Contains(snaps, "Last snapshot") || strings.Contains(snaps, "Last snapshot\nnone yet") {
		t.Errorf("the snapshots tab:\n%s", snaps)
	}
	shot("snapshots")

	// The SQL editor: queries run as the owner's own short-lived
	// credential; results as a table, errors as PostgreSQL reports them,
	// and no credential password anywhere in the page.
	sqlRun := func(what, query, wait string) string {
		t.Helper()
		var html string
		run(t, ctx, 60*time.Second, what,
			chromedp.Navigate(svcURL+"/sql"),
			chromedp.WaitVisible("#sql-query", chromedp.ByID),
			chromedp.SetValue("#sql-query", query, chromedp.ByID),
			chromedp.Submit("#sql-query", chromedp.ByID),
			chromedp.WaitVisible(wait, chromedp.ByQuery),
			chromedp.OuterHTML("main", &html, chromedp.ByQuery),
		)
		return html
	}
	sqlRun("make a table in the SQL editor", "CREATE TABLE browser_t AS SELECT 42 AS answer", "#h-result")
	html := sqlRun("query it", "SELECT answer FROM browser_t", "#sql-result")
	if !strings.Contains(html, "<th scope=\"col\">answer</th>") || !strings.Contains(html, "<td>42</td>") || !strings.Contains(html, "dbcloud_cred_") {
		t.Errorf("the SQL editor's result:\n%s", html)
	}
	shot("sql")
	pageAtWidths(t, ctx, shot, consolePage{name: "SQL editor with a result", wait: "#sql-result"})
	html = sqlRun("a failing query", "SELECT 1/0", "#sql-error")
	if !strings.Contains(html, "division by zero (SQLSTATE 22012)") || strings.Contains(html, "postgresql://dbcloud_cred_") {
		t.Errorf("the SQL editor's error:\n%s", html)
	}
	testViewerSQL(t, s, origin, svcURL)
	if html := sqlRun("the viewer's table", "SELECT count(*) AS n FROM pg_class WHERE relname = 'viewer_t'", "#sql-result"); !strings.Contains(html, "<td>0</td>") {
		t.Errorf("a viewer's CREATE TABLE made a table:\n%s", html)
	}

	// Every page of the console passes axe-core and holds at each width.
	p := origin + "/p/" + pid
	testPagesAccessible(t, ctx, shot, []consolePage{
		{name: "services", url: p + "/services", wait: "#svc-name", shot: "services"},
		{name: "service", url: svcURL, wait: "#conn", shot: "service"},
		{name: "connect", url: svcURL + "/connect", wait: "#snip-psql", shot: "connect"},
		{name: "SQL editor", url: svcURL + "/sql", wait: "#sql-query", shot: "sql"},
		{name: "logs", url: svcURL + "/logs", wait: "#log-search", shot: "logs"},
		{name: "snapshots", url: svcURL + "/snapshots", wait: "#h-snaps"},
		{name: "credentials", url: svcURL + "/credentials", wait: "#cred-name"},
		{name: "VPCs", url: p + "/vpcs", wait: "#vpc-name"},
		{name: "API keys", url: p + "/keys", wait: "#key-name"},
		{name: "members", url: p + "/members", wait: "#m-email"},
		{name: "account", url: origin + "/account", wait: "#pw-current"},
		{name: "new project", url: origin + "/projects/new", wait: "#project-name"},
		{name: "an error page", url: origin + "/p/no-such-project/services", wait: "main .error"},
	})
	// A form's errors, beside their fields.
	run(t, ctx, 30*time.Second, "a refused password change",
		chromedp.Navigate(origin+"/account"),
		chromedp.SendKeys("#pw-current", "not-the-password", chromedp.ByID),
		chromedp.SendKeys("#pw-new", "a-new-password-long-enough", chromedp.ByID),
		chromedp.SendKeys("#pw-again", "a-new-password-long-enough", chromedp.ByID),
		chromedp.Submit("#pw-current", chromedp.ByID),
		chromedp.WaitVisible("#err-current", chromedp.ByID),
	)
	pageAtWidths(t, ctx, shot, consolePage{name: "a form with its errors", wait: "#err-current"})

	// A command-line client's OAuth login, approved in this browser.
	testOAuthInBrowser(t, ctx, s, origin)

	// An API key: created (shown once), used, revoked, refused.
	var access, secret string
	run(t, ctx, 30*time.Second, "create an API key",
		chromedp.Navigate(origin+"/p/"+pid+"/keys"),
		chromedp.SendKeys("#key-name", "browser-key", chromedp.ByID),
		chromedp.Submit("#key-name", chromedp.ByID),
		chromedp.WaitVisible("#secret-secret-key", chromedp.ByID),
		chromedp.Text("#secret-access-key", &access, chromedp.ByID),
		chromedp.Text("#secret-secret-key", &secret, chromedp.ByID),
	)
	if code := apiWithKey(t, s, access, secret); code != 200 {
		t.Fatalf("the new key: %d, want 200", code)
	}
	run(t, ctx, 30*time.Second, "revoke the key",
		chromedp.Navigate(origin+"/p/"+pid+"/keys"),
		chromedp.Click(`button[aria-label="Revoke key browser-key"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`.notice`, chromedp.ByQuery),
	)
	shot("keys")
	if code := apiWithKey(t, s, access, secret); code != 401 {
		t.Fatalf("the revoked key: %d, want 401", code)
	}
	run(t, ctx, 30*time.Second, "members", chromedp.Navigate(origin+"/p/"+pid+"/members"), chromedp.WaitVisible("#m-email", chromedp.ByID))
	shot("members")

	// Sign out: back to the sign-in page, and the console is closed.
	var where string
	run(t, ctx, 30*time.Second, "sign out",
		chromedp.Click(`form.signout button`, chromedp.ByQuery),
		chromedp.WaitVisible("#email", chromedp.ByID),
		chromedp.Navigate(origin+"/p/"+pid+"/services"),
		chromedp.WaitVisible("#email", chromedp.ByID),
		chromedp.Location(&where),
	)
	if !strings.Contains(where, "/signin") {
		t.Errorf("after sign-out the console opened %s", where)
	}
}

// testViewerSQL: a viewer, signed in in a browser of their own, reads
// through the SQL editor (a READ_ONLY credential) and cannot write.
func testViewerSQL(t *testing.T, s *server, origin, svcURL string) {
	t.Helper()
	var viewer struct{ Password string }
	if err := json.Unmarshal(s.admin("user", "create", "--email", "vera@example.com", "--name", "Vera",
		"--project", s.boot.ProjectID, "--role", "viewer", "--json"), &viewer); err != nil || viewer.Password == "" {
		t.Fatalf("make a viewer: %v", err)
	}
	vctx, _ := chrome(t)
	run(t, vctx, 30*time.Second, "the viewer signs in",
		chromedp.Navigate(origin+"/"),
		chromedp.WaitVisible("#email", chromedp.ByID),
		chromedp.SendKeys("#email", "vera@example.com", chromedp.ByID),
		chromedp.SendKeys("#password", viewer.Password, chromedp.ByID),
		chromedp.Submit("#password", chromedp.ByID),
		// The services page's own field, which every role sees: the
		// sign-in page has a main too, and a navigation started while
		// the sign-in's own is still under way is aborted.
		chromedp.WaitVisible("#svc-search", chromedp.ByID),
	)
	query := func(what, q, wait string) string {
		t.Helper()
		var html string
		run(t, vctx, 60*time.Second, what,
			chromedp.Navigate(svcURL+"/sql"),
			chromedp.WaitVisible("#sql-query", chromedp.ByID),
			chromedp.SetValue("#sql-query", q, chromedp.ByID),
			chromedp.Submit("#sql-query", chromedp.ByID),
			chromedp.WaitVisible(wait, chromedp.ByQuery),
			chromedp.OuterHTML("main", &html, chromedp.ByQuery),
		)
		return html
	}
	// (browser_t is the owner's credential's until that expires, as
	// decisions.md section 12 says, so the viewer reads the catalogue.)
	if html := query("the viewer reads", "SELECT relname FROM pg_class WHERE relname = 'browser_t'", "#sql-result"); !strings.Contains(html, "<td>browser_t</td>") {
		t.Errorf("the viewer's read:\n%s", html)
	}
	html := query("the viewer tries to write", "CREATE TABLE viewer_t (x int)", "#sql-error")
	if !strings.Contains(html, "read-only transaction (SQLSTATE 25006)") && !strings.Contains(html, "(SQLSTATE 42501)") {
		t.Errorf("the viewer's write was not refused as PostgreSQL refuses it:\n%s", html)
	}
}

// testLivePages: open pages follow the project's event stream. Changes
// made through the API (a resize, a new service, deletes) show on an
// open page without a reload: a mark set on the page's window survives.
func testLivePages(t *testing.T, ctx context.Context, s *server, origin, forkID string) {
	t.Helper()
	pid := s.boot.ProjectID
	mark := chromedp.Evaluate(`window.notReloaded = true`, nil)
	kept := func(what string) {
		t.Helper()
		var still bool
		run(t, ctx, 10*time.Second, "read the mark", chromedp.Evaluate(`window.notReloaded === true`, &still))
		if !still {
			t.Fatalf("%s: the page was reloaded", what)
		}
	}
	run(t, ctx, 30*time.Second, "open the fork's page",
		chromedp.Navigate(origin+"/p/"+pid+"/services/"+forkID),
		chromedp.WaitVisible(`#live-props dd.status-READY`, chromedp.ByQuery),
		mark,
	)
	s.accepted("POST", s.services()+"/"+forkID+"/resize", map[string]string{"cpu_millis": "shared", "memory_gbs": "shared"})
	run(t, ctx, 3*time.Minute, "the resize shows on the open page",
		chromedp.WaitVisible(`//section[@id="live-props"]//dd[text()="shared/shared"]`, chromedp.BySearch),
	)
	kept("resize")

	// The list: a service created through the API appears, and goes
	// when it is deleted through the API.
	run(t, ctx, 30*time.Second, "open the services list",
		chromedp.Navigate(origin+"/p/"+pid+"/services"),
		chromedp.WaitVisible(`#live-services table`, chromedp.ByQuery),
		mark,
	)
	created := s.create(map[string]any{"name": "browser-live", "cpu_millis": "shared"})
	run(t, ctx, time.Minute, "a new service appears on the open list",
		chromedp.WaitVisible(`//a[text()="browser-live"]`, chromedp.BySearch),
	)
	s.accepted("DELETE", s.services()+"/"+created.ServiceID, nil)
	run(t, ctx, 3*time.Minute, "the deleted service leaves the open list",
		chromedp.WaitNotPresent(`//a[text()="browser-live"]`, chromedp.BySearch),
	)
	kept("create and delete on the list")

	// The fork's page, when the fork is deleted through the API.
	run(t, ctx, 30*time.Second, "open the fork's page again",
		chromedp.Navigate(origin+"/p/"+pid+"/services/"+forkID),
		chromedp.WaitVisible(`#live-props`, chromedp.ByQuery),
		mark,
	)
	s.accepted("DELETE", s.services()+"/"+forkID, nil)
	run(t, ctx, 3*time.Minute, "the open page says the service is deleted",
		chromedp.WaitVisible(`//div[@id="live-gone" and contains(., "deleted")]`, chromedp.BySearch),
	)
	kept("delete on the service page")
}

// testLogsTail: a logs page with its live tail on shows a new line
// without a reload and without a timer of its own: a refused sign-in
// through the endpoint makes PostgreSQL log a FATAL naming the user, and
// the project's event stream tells the page.
func testLogsTail(t *testing.T, ctx context.Context, svcURL, conn string) {
	t.Helper()
	// A repeating timer is what the test rules out: in this page none
	// runs, so only the stream can bring the line.
	var noTimers page.ScriptIdentifier
	run(t, ctx, 30*time.Second, "open the logs with the live tail on",
		chromedp.ActionFunc(func(ctx context.Context) (err error) {
			noTimers, err = page.AddScriptToEvaluateOnNewDocument(`window.setInterval = function () { return 0; };`).Do(ctx)
			return err
		}),
		chromedp.Navigate(svcURL+"/logs?tail=1"),
		chromedp.WaitVisible(`#live-logs[data-tail]`, chromedp.ByQuery),
		chromedp.Evaluate(`window.notReloaded = true`, nil),
	)
	defer run(t, ctx, 10*time.Second, "timers back", page.RemoveScriptToEvaluateOnNewDocument(noTimers))
	u, err := url.Parse(conn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("tail_probe", "wrong")
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c, err := pgx.Connect(cctx, u.String()); err == nil {
		c.Close(cctx)
		t.Fatal("a wrong password was let in")
	}
	var still bool
	run(t, ctx, time.Minute, "the refused sign-in appears in the open tail",
		chromedp.WaitVisible(`//pre[contains(@class, "logs")]/span[contains(., "tail_probe")]`, chromedp.BySearch),
		chromedp.Evaluate(`window.notReloaded === true`, &still),
	)
	if !still {
		t.Fatal("the logs page was reloaded")
	}
}

func apiWithKey(t *testing.T, s *server, access, secret string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", s.baseURL+"/projects", nil)
	req.SetBasicAuth(access, secret)
	res, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// testOAuthInBrowser plays `tiger auth login` (the original CLI's client
// id, PKCE S256, a loopback callback on a free port) while Chromium, signed
// in, approves; the token then lists the user's projects.
func testOAuthInBrowser(t *testing.T, ctx context.Context, s *server, origin string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := oauth2.Config{
		ClientID:    oauth.TigerCLIClientID,
		Endpoint:    oauth2.Endpoint{AuthURL: origin + "/oauth/authorize", TokenURL: origin + console.TokenPath, AuthStyle: oauth2.AuthStyleInParams},
		RedirectURL: fmt.Sprintf("http://localhost:%d/callback", ln.Addr().(*net.TCPAddr).Port),
	}
	verifier, state := oauth2.GenerateVerifier(), "browser-state"
	octx := context.WithValue(context.Background(), oauth2.HTTPClient, s.client)
	tokens := make(chan *oauth2.Token, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("state") != state {
			http.Error(w, "bad state", 400)
			return
		}
		tok, err := cfg.Exchange(octx, r.URL.Query().Get("code"), oauth2.VerifierOption(verifier))
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		tokens <- tok
		http.Redirect(w, r, origin+"/oauth/code/success", http.StatusTemporaryRedirect)
	})}
	go srv.Serve(ln)
	defer srv.Close()

	var client string
	run(t, ctx, 30*time.Second, "approve the CLI",
		chromedp.Navigate(cfg.AuthCodeURL(state, oauth2.S256ChallengeOption(verifier))),
		chromedp.WaitVisible(`button[value="approve"]`, chromedp.ByQuery),
		chromedp.Text("main .card p strong", &client, chromedp.ByQuery),
	)
	pageAtWidths(t, ctx, func(string) {}, consolePage{name: "the OAuth approval", wait: `button[value="approve"]`})
	if !strings.Contains(client, "Tiger CLI") {
		t.Errorf("the approval page names %q, want the client", client)
	}
	run(t, ctx, 30*time.Second, "approve",
		chromedp.Click(`button[value="approve"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`//h1[contains(., "You are signed in")]`, chromedp.BySearch),
	)
	pageAtWidths(t, ctx, func(string) {}, consolePage{name: "the OAuth success page", wait: "h1"})
	var tok *oauth2.Token
	select {
	case tok = <-tokens:
	case <-time.After(10 * time.Second):
		t.Fatal("the CLI's callback got no code")
	}
	var projects []struct{ ID string }
	res, err := oauth2.NewClient(octx, oauth2.StaticTokenSource(tok)).Get(s.baseURL + "/projects")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	json.NewDecoder(res.Body).Decode(&projects)
	if res.StatusCode != 200 || len(projects) != 1 || projects[0].ID != s.boot.ProjectID {
		t.Fatalf("GET /projects with the OAuth token: %d %+v", res.StatusCode, projects)
	}
}
