package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestTigerCLILogin runs the original's own CLI against dbcloud: `tiger
// auth login` (its OAuth flow, browser step done by Chromium), then `tiger
// service list` and `tiger auth logout`. The CLI cannot be installed from
// the Go module proxy this project uses (it answers 403 for
// github.com/timescale/tiger-cli), so the test runs only when
// DBCLOUD_TIGER_BIN names a tiger binary built from its source. An
// auto-paused service (decisions.md section 10) is one the CLI shows as
// PAUSED, a status it knows, and its extra fields do not trouble it.
func TestTigerCLILogin(t *testing.T) {
	bin := os.Getenv("DBCLOUD_TIGER_BIN")
	if bin == "" {
		t.Skip("DBCLOUD_TIGER_BIN is not set: no tiger binary to run (it is not on the module proxy)")
	}
	s := newServer(t, "--test-auto-pause-second", autoPauseSecond)
	var owner ownerFile
	raw, _ := os.ReadFile(filepath.Join(s.dir, "bootstrap.json"))
	json.Unmarshal(raw, &owner)
	origin := strings.TrimSuffix(owner.ConsoleURL, "/")
	paused := s.create(map[string]any{"name": "seen-by-tiger"}).ServiceID
	s.waitStatus(paused, "READY", readyWithin())
	s.setAutoPause(paused, 60)
	s.waitStatus(paused, "PAUSED", 2*time.Minute)

	// tiger opens the browser with xdg-open; this one hands the URL to
	// the test, which opens it in Chromium.
	home := t.TempDir()
	shim := filepath.Join(home, "bin")
	os.MkdirAll(shim, 0o755)
	urlFile := filepath.Join(home, "auth-url")
	os.WriteFile(filepath.Join(shim, "xdg-open"), []byte("#!/bin/sh\nprintf '%s' \"$1\" > '"+urlFile+"'\n"), 0o755)
	env := append(os.Environ(),
		"PATH="+shim+":"+os.Getenv("PATH"), "HOME="+home, "TIGER_CONFIG_DIR="+filepath.Join(home, "tiger"),
		"TIGER_CONSOLE_URL="+origin, "TIGER_GATEWAY_URL="+origin+"/api", "TIGER_API_URL="+s.baseURL,
		"SSL_CERT_FILE="+s.boot.CAFile, "TIGER_ANALYTICS=false", "TIGER_VERSION_CHECK=false", "TIGER_PASSWORD_STORAGE=none",
	)
	tiger := func(ctx context.Context, args ...string) *exec.Cmd {
		c := exec.CommandContext(ctx, bin, args...)
		c.Env = env
		return c
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	login := tiger(ctx, "auth", "login")
	login.Stdout, login.Stderr = &out, &out
	if err := login.Start(); err != nil {
		t.Fatal(err)
	}
	var authURL string
	for deadline := time.Now().Add(30 * time.Second); authURL == ""; {
		if b, err := os.ReadFile(urlFile); err == nil && len(b) > 0 {
			authURL = string(b)
		} else if time.Now().After(deadline) {
			t.Fatalf("tiger auth login opened no browser:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	bctx, shot := chrome(t)
	run(t, bctx, 60*time.Second, "sign in and approve tiger",
		chromedp.Navigate(authURL),
		chromedp.WaitVisible("#email", chromedp.ByID),
		chromedp.SendKeys("#email", owner.OwnerEmail, chromedp.ByID),
		chromedp.SendKeys("#password", owner.OwnerPassword, chromedp.ByID),
		chromedp.Submit("#password", chromedp.ByID),
		chromedp.WaitVisible(`button[value="approve"]`, chromedp.ByQuery),
		chromedp.ActionFunc(func(context.Context) error { shot("oauth-approve"); return nil }),
		chromedp.Click(`button[value="approve"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`//h1[contains(., "You are signed in")]`, chromedp.BySearch),
	)
	if err := login.Wait(); err != nil {
		t.Fatalf("tiger auth login: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "Successfully logged in (project: "+s.boot.ProjectID+")") {
		t.Fatalf("tiger auth login said:\n%s", out.String())
	}
	list, err := tiger(ctx, "service", "list").CombinedOutput()
	if err != nil || !strings.Contains(string(list), "seen-by-tiger") {
		t.Fatalf("tiger service list: %v\n%s", err, list)
	}
	get, err := tiger(ctx, "service", "get", paused, "-o", "json").CombinedOutput()
	if err != nil || !strings.Contains(string(get), `"PAUSED"`) {
		t.Fatalf("tiger service get of an auto-paused service: %v\n%s", err, get)
	}
	if b, err := tiger(ctx, "auth", "logout").CombinedOutput(); err != nil {
		t.Fatalf("tiger auth logout: %v\n%s", err, b)
	}
}
