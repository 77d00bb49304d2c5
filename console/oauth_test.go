package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	stdhttp "net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"dbcloud/cloud"

	"golang.org/x/oauth2"

	"dbcloud"
	"dbcloud/console"
	"dbcloud/history"
	"dbcloud/http"
	"dbcloud/identity"
	"dbcloud/oauth"
	"dbcloud/sqlite"
)

// site is a dbcloud origin (API, console, OAuth) over HTTPS on a real
// store, with a clock the test can move.
type site struct {
	t     *testing.T
	cloud *cloud.Cloud
	srv   *httptest.Server
	boot  *cloud.Bootstrap
	mu    sync.Mutex
	now   time.Time
}

func newSite(t *testing.T, rt dbcloud.Runtime) *site {
	t.Helper()
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "dbcloud.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := &site{t: t, now: time.Now()}
	// Events recorded as dbcloud serve records them, for the live pages.
	s.cloud = cloud.New(history.NewEventStore(store), rt, cloud.DefaultConfig(), logger)
	s.cloud.PasswordParams = &identity.PasswordParams{Time: 1, Memory: 1024, Threads: 1}
	s.cloud.Now = s.clock
	if s.boot, err = s.cloud.Bootstrap(ctx, "Ada Owner", "ada@example.com"); err != nil {
		t.Fatal(err)
	}
	api := http.NewHandler(s.cloud, http.Config{}, logger)
	s.srv = httptest.NewUnstartedServer(console.New(s.cloud, oauth.New(s.cloud), api, logger).WithCA([]byte(testCAPEM)))
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *site) clock() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

func (s *site) advance(d time.Duration) {
	s.mu.Lock()
	s.now = s.now.Add(d)
	s.mu.Unlock()
}

// browser is a person's browser: a cookie jar that trusts the site.
type browser struct {
	t *testing.T
	c *stdhttp.Client
	s *site
}

func (s *site) browser() *browser {
	jar, _ := cookiejar.New(nil)
	// A copy: the server's client is one shared value, and each browser
	// needs its own cookies.
	c := *s.srv.Client()
	c.Jar = jar
	return &browser{t: s.t, c: &c, s: s}
}

func (b *browser) get(u string) (*stdhttp.Response, string) {
	b.t.Helper()
	res, err := b.c.Get(u)
	if err != nil {
		b.t.Fatalf("GET %s: %v", u, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

func (b *browser) post(u string, form url.Values) (*stdhttp.Response, string) {
	b.t.Helper()
	res, err := b.c.PostForm(u, form)
	if err != nil {
		b.t.Fatalf("POST %s: %v", u, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// hidden reads a page's hidden form fields (the first of each name).
func hidden(page string) url.Values {
	v := url.Values{}
	for _, m := range hiddenRE.FindAllStringSubmatch(page, -1) {
		if v.Get(m[1]) == "" {
			v.Set(m[1], htmlUnescape(m[2]))
		}
	}
	return v
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&#43;", "+", "&#34;", `"`, "&#39;", "'", "&lt;", "<", "&gt;", ">").Replace(s)
}

// signIn fills the sign-in form the page shows.
func (b *browser) signIn(page, email, password string) (*stdhttp.Response, string) {
	b.t.Helper()
	f := hidden(page)
	f.Set("email", email)
	f.Set("password", password)
	return b.post(b.s.srv.URL+"/signin", f)
}

// cli plays the command-line client as the original's does: a loopback
// callback on a free port, PKCE S256, and the token exchange.
type cli struct {
	cfg      oauth2.Config
	verifier string
	state    string
	codes    chan string
	ctx      context.Context
}

func (s *site) cli(t *testing.T) *cli {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cli{verifier: oauth2.GenerateVerifier(), state: "st-" + dbcloud.NewID(), codes: make(chan string, 1)}
	c.cfg = oauth2.Config{
		ClientID: oauth.TigerCLIClientID,
		Endpoint: oauth2.Endpoint{
			AuthURL: s.srv.URL + "/oauth/authorize", TokenURL: s.srv.URL + console.TokenPath,
			AuthStyle: oauth2.AuthStyleInParams,
		},
		RedirectURL: "http://localhost:" + portOf(ln) + "/callback",
	}
	c.ctx = context.WithValue(context.Background(), oauth2.HTTPClient, s.srv.Client())
	srv := &stdhttp.Server{Handler: stdhttp.HandlerFunc(func(w stdhttp.ResponseWriter, r *stdhttp.Request) {
		if r.URL.Query().Get("state") != c.state {
			stdhttp.Error(w, "bad state", 400)
			c.codes <- ""
			return
		}
		c.codes <- r.URL.Query().Get("code")
		stdhttp.Redirect(w, r, s.srv.URL+"/oauth/code/success", stdhttp.StatusTemporaryRedirect)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return c
}

func portOf(ln net.Listener) string { return strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:") }

func (c *cli) authURL() string {
	return c.cfg.AuthCodeURL(c.state, oauth2.S256ChallengeOption(c.verifier))
}

// login runs the browser through sign-in and approval and returns the code
// the callback got.
func (c *cli) login(t *testing.T, b *browser, s *site) string {
	t.Helper()
	res, page := b.get(c.authURL())
	if res.Request.URL.Path == "/signin" {
		res, page = b.signIn(page, s.boot.User.Email, s.boot.Password)
	}
	if res.Request.URL.Path != "/oauth/authorize" || !strings.Contains(page, "Tiger CLI") {
		t.Fatalf("after sign-in: %s %d, want the approval page naming the client:\n%s", res.Request.URL, res.StatusCode, page)
	}
	f := hidden(page)
	f.Set("decision", "approve")
	res, page = b.post(s.srv.URL+"/oauth/authorize", f)
	if res.Request.URL.Path != "/oauth/code/success" || !strings.Contains(page, "You are signed in") {
		t.Fatalf("after approval: %s %d, want the success page:\n%s", res.Request.URL, res.StatusCode, page)
	}
	return <-c.codes
}

// TestOAuthLogin plays the original CLI's `tiger auth login` against
// dbcloud: PKCE, loopback callback, sign-in and approval in the browser,
// the code exchanged for tokens; the token lists the user's projects, and
// refresh rotates.
func TestOAuthLogin(t *testing.T) {
	s := newSite(t, nil)
	c := s.cli(t)
	b := s.browser()
	if res, _ := b.get(c.authURL()); res.Request.URL.Path != "/signin" {
		t.Fatalf("authorize without a session went to %s, want the sign-in page", res.Request.URL)
	}
	code := c.login(t, b, s)
	tok, err := c.cfg.Exchange(c.ctx, code, oauth2.VerifierOption(c.verifier))
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	if tok.RefreshToken == "" || tok.TokenType != "Bearer" || tok.Expiry.IsZero() {
		t.Fatalf("token %+v, want a Bearer token with refresh token and expiry", tok)
	}
	client := oauth2.NewClient(c.ctx, c.cfg.TokenSource(c.ctx, tok))
	var projects []struct{ ID string }
	getJSON(t, client, s.srv.URL+http.BasePath+"/projects", 200, &projects)
	if len(projects) != 1 || projects[0].ID != s.boot.Project.ID {
		t.Fatalf("GET /projects with the token: %+v, want the owner's project", projects)
	}
	var info struct {
		Type  string
		OAuth struct {
			User struct{ ID, Name, Email string }
		}
	}
	getJSON(t, client, s.srv.URL+http.BasePath+"/auth/info", 200, &info)
	if info.Type != "oauth" || info.OAuth.User.Email != "ada@example.com" || info.OAuth.User.Name != "Ada Owner" {
		t.Fatalf("auth/info %+v", info)
	}

	// Refresh rotates: a new pair; the old refresh token, used again, is
	// refused and ends the whole login.
	old := *tok
	old.Expiry = time.Now().Add(-time.Minute)
	fresh, err := c.cfg.TokenSource(c.ctx, &old).Token()
	if err != nil {
		t.Fatalf("refresh: %v", err)
	}
	if fresh.AccessToken == tok.AccessToken || fresh.RefreshToken == tok.RefreshToken {
		t.Fatal("refresh did not rotate the tokens")
	}
	getJSON(t, oauth2.NewClient(c.ctx, oauth2.StaticTokenSource(fresh)), s.srv.URL+http.BasePath+"/projects", 200, nil)
	if _, err := c.cfg.TokenSource(c.ctx, &old).Token(); !isInvalidGrant(err) {
		t.Fatalf("second use of a rotated refresh token: %v, want invalid_grant", err)
	}
	getJSON(t, oauth2.NewClient(c.ctx, oauth2.StaticTokenSource(fresh)), s.srv.URL+http.BasePath+"/projects", 401, nil)
}

// TestOAuthRefusals: a wrong verifier, a reused code, a foreign redirect
// URI, an expired code and a revoked refresh token are all refused.
func TestOAuthRefusals(t *testing.T) {
	s := newSite(t, nil)
	b := s.browser()

	t.Run("wrong verifier", func(t *testing.T) {
		c := s.cli(t)
		code := c.login(t, b, s)
		_, err := c.cfg.Exchange(c.ctx, code, oauth2.VerifierOption(oauth2.GenerateVerifier()))
		if !isInvalidGrant(err) {
			t.Fatalf("exchange with another verifier: %v, want invalid_grant", err)
		}
		// Nor may PKCE be skipped.
		if _, err := c.cfg.Exchange(c.ctx, code); err == nil {
			t.Fatal("exchange without a verifier succeeded")
		}
	})
	t.Run("reused code", func(t *testing.T) {
		c := s.cli(t)
		code := c.login(t, b, s)
		tok, err := c.cfg.Exchange(c.ctx, code, oauth2.VerifierOption(c.verifier))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.cfg.Exchange(c.ctx, code, oauth2.VerifierOption(c.verifier)); !isInvalidGrant(err) {
			t.Fatalf("second exchange: %v, want invalid_grant", err)
		}
		// The replay ends what the first exchange gave.
		getJSON(t, oauth2.NewClient(c.ctx, oauth2.StaticTokenSource(tok)), s.srv.URL+http.BasePath+"/projects", 401, nil)
	})
	t.Run("foreign redirect URI", func(t *testing.T) {
		c := s.cli(t)
		for _, foreign := range []string{"https://attacker.example/cb", "http://attacker.example:8080/callback", "http://localhost.attacker.example:9/callback"} {
			u := strings.Replace(c.authURL(), url.QueryEscape(c.cfg.RedirectURL), url.QueryEscape(foreign), 1)
			b.c.CheckRedirect = func(r *stdhttp.Request, _ []*stdhttp.Request) error {
				if r.URL.Host != strings.TrimPrefix(s.srv.URL, "https://") {
					return errors.New("redirected off the site to " + r.URL.String())
				}
				return nil
			}
			res, page := b.get(u)
			b.c.CheckRedirect = nil
			if res.StatusCode != 400 || !strings.Contains(page, "loopback") {
				t.Errorf("authorize with redirect_uri %s: %d, want 400 shown to the user:\n%s", foreign, res.StatusCode, page)
			}
		}
		// A code is bound to its redirect URI.
		code := c.login(t, b, s)
		other := c.cfg
		other.RedirectURL = "http://127.0.0.1:1/callback"
		if _, err := other.Exchange(c.ctx, code, oauth2.VerifierOption(c.verifier)); !isInvalidGrant(err) {
			t.Fatalf("exchange with another redirect_uri: %v, want invalid_grant", err)
		}
	})
	t.Run("plain PKCE refused", func(t *testing.T) {
		c := s.cli(t)
		u := c.cfg.AuthCodeURL(c.state, oauth2.SetAuthURLParam("code_challenge", c.verifier), oauth2.SetAuthURLParam("code_challenge_method", "plain"))
		b.get(u)
		// The error goes back to the (checked) loopback callback, with no code.
		if code := <-c.codes; code != "" {
			t.Fatalf("plain PKCE got a code")
		}
	})
	t.Run("expired code", func(t *testing.T) {
		c := s.cli(t)
		code := c.login(t, b, s)
		s.advance(time.Minute)
		if _, err := c.cfg.Exchange(c.ctx, code, oauth2.VerifierOption(c.verifier)); !isInvalidGrant(err) {
			t.Fatalf("exchange a minute later: %v, want invalid_grant", err)
		}
	})
	t.Run("revoked refresh token", func(t *testing.T) {
		c := s.cli(t)
		code := c.login(t, b, s)
		tok, err := c.cfg.Exchange(c.ctx, code, oauth2.VerifierOption(c.verifier))
		if err != nil {
			t.Fatal(err)
		}
		// tiger auth logout: POST /auth/logout {"refresh_token"} with the access token.
		req, _ := stdhttp.NewRequest("POST", s.srv.URL+http.BasePath+"/auth/logout", strings.NewReader(`{"refresh_token":"`+tok.RefreshToken+`"}`))
		req.Header.Set("Content-Type", "application/json")
		tok.SetAuthHeader(req)
		res, err := s.srv.Client().Do(req)
		if err != nil || res.StatusCode != 204 {
			t.Fatalf("logout: %v %v", res, err)
		}
		old := *tok
		old.Expiry = time.Now().Add(-time.Minute)
		if _, err := c.cfg.TokenSource(c.ctx, &old).Token(); !isInvalidGrant(err) {
			t.Fatalf("refresh after logout: %v, want invalid_grant", err)
		}
		getJSON(t, oauth2.NewClient(c.ctx, oauth2.StaticTokenSource(tok)), s.srv.URL+http.BasePath+"/projects", 401, nil)
	})
	t.Run("unknown client", func(t *testing.T) {
		c := s.cli(t)
		c.cfg.ClientID = "someone-else"
		res, _ := b.get(c.authURL())
		if res.StatusCode != 400 {
			t.Fatalf("unknown client: %d, want 400", res.StatusCode)
		}
	})
}

func isInvalidGrant(err error) bool {
	var re *oauth2.RetrieveError
	return errors.As(err, &re) && re.ErrorCode == "invalid_grant"
}

func getJSON(t *testing.T, c *stdhttp.Client, u string, status int, v any) {
	t.Helper()
	res, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != status {
		t.Fatalf("GET %s: %d %s, want %d", u, res.StatusCode, body, status)
	}
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("decode %s: %v", body, err)
		}
	}
}
