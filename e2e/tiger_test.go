package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
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
	bin := tigerBin(t)
	s := newServer(t, "--test-auto-pause-second", autoPauseSecond)
	owner := s.owner()
	origin := strings.TrimSuffix(owner.ConsoleURL, "/")
	paused := s.create(map[string]any{"name": "seen-by-tiger"}).ServiceID
	s.waitStatus(paused, "READY", readyWithin())
	s.setAutoPause(paused, 60)
	s.waitStatus(paused, "PAUSED", 2*time.Minute)

	home := t.TempDir()
	shim, urlFile := tigerShim(t, bin, home)
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
	approveTiger(t, urlFile, owner, "oauth-approve")
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

// tigerWalkthroughMarker precedes the README's block that points the
// original's CLI at dbcloud for good.
const tigerWalkthroughMarker = "<!-- tiger walkthrough -->"

// TestReadme_TigerCLI runs the README's block on the original's CLI as
// written, as TestReadme_Walkthrough runs its own: bash with no variables
// set but PATH (where tiger is) and HOME, in a directory whose
// dbcloud-data is the server's. Its `tiger auth login` is approved in
// Chromium; the configuration it wrote then lists the project's service
// and shows dbcloud's URLs.
func TestReadme_TigerCLI(t *testing.T) {
	bin := tigerBin(t)
	script := readmeBlocks(t, tigerWalkthroughMarker)
	s := newServer(t)
	s.create(map[string]any{"name": "listed-by-tiger"})
	work := t.TempDir()
	if err := os.Symlink(s.dir, filepath.Join(work, "dbcloud-data")); err != nil {
		t.Fatal(err)
	}
	shim, urlFile := tigerShim(t, bin, work)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+script)
	cmd.Dir = work
	cmd.Env = []string{"PATH=" + shim + ":" + os.Getenv("PATH"), "HOME=" + work}
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	approveTiger(t, urlFile, s.owner(), "")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the README's tiger block failed: %v\n%s\n--- script ---\n%s", err, out.String(), script)
	}
	if !strings.Contains(out.String(), "listed-by-tiger") {
		t.Errorf("the README's tiger service list did not list the service:\n%s", out.String())
	}
	// `tiger config show` prints a table of what is in effect.
	origin := strings.TrimSuffix(s.owner().ConsoleURL, "/")
	for key, want := range map[string]string{"api_url": s.baseURL, "console_url": origin, "gateway_url": origin + "/api",
		"password_storage": "pgpass", "version_check": "false", "analytics": "false"} {
		if !regexp.MustCompile(`(?m)^\W*` + key + `\s*\W\s*` + regexp.QuoteMeta(want) + `\s*\W*$`).MatchString(out.String()) {
			t.Errorf("tiger config show has no %s = %s:\n%s", key, want, out.String())
		}
	}
}

// tigerBin is the original's CLI to run, or skips the test: the CLI
// cannot be installed from the Go module proxy this project uses (it
// answers 403 for github.com/timescale/tiger-cli), so DBCLOUD_TIGER_BIN
// names a tiger built from its source.
func tigerBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("DBCLOUD_TIGER_BIN")
	if bin == "" {
		t.Skip("DBCLOUD_TIGER_BIN is not set: no tiger binary to run (it is not on the module proxy)")
	}
	return bin
}

// tigerShim makes a directory to put first on PATH, holding tiger and an
// xdg-open (what tiger opens the browser with) that hands the URL to the
// test through the file it returns.
func tigerShim(t *testing.T, bin, home string) (dir, urlFile string) {
	t.Helper()
	dir = filepath.Join(home, "bin")
	urlFile = filepath.Join(home, "auth-url")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(dir, "tiger")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "xdg-open"), []byte("#!/bin/sh\nprintf '%s' \"$1\" > '"+urlFile+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, urlFile
}

// approveTiger waits for the login URL tiger opened, then signs in as the
// owner in Chromium and approves; shot, when set, names a screenshot of
// the approval page.
func approveTiger(t *testing.T, urlFile string, owner ownerFile, shotName string) {
	t.Helper()
	var authURL string
	for deadline := time.Now().Add(30 * time.Second); authURL == ""; {
		if b, err := os.ReadFile(urlFile); err == nil && len(b) > 0 {
			authURL = string(b)
		} else if time.Now().After(deadline) {
			t.Fatal("tiger auth login opened no browser within 30s")
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
		chromedp.ActionFunc(func(context.Context) error {
			if shotName != "" {
				shot(shotName)
			}
			return nil
		}),
		chromedp.Click(`button[value="approve"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`//h1[contains(., "You are signed in")]`, chromedp.BySearch),
	)
}

// lockedBuffer collects a process's output while the test may read it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
