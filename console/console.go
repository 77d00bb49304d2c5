// Package console is dbcloud's web console and the browser half of OAuth
// login for command-line clients, on the API's own origin. Pages are
// rendered on the server from embedded templates; the little JavaScript
// there is (copy buttons, live status, confirmations) lives in embedded
// files, so the Content-Security-Policy needs no unsafe-inline and nothing
// is fetched from anywhere else at run time.
//
// Handlers translate: they call the domain (dbcloud.Cloud, oauth.Server)
// with the signed-in user as the principal, and show its answers and its
// error messages.
package console

import (
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"dbcloud/cloud"

	"golang.org/x/time/rate"

	"dbcloud"
	"dbcloud/oauth"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Cookie names. The __Host- prefix makes browsers insist on Secure, Path=/
// and no Domain, so no other site or subdomain can plant one.
const (
	sessionCookie = "__Host-dbcloud_session"
	preCSRFCookie = "__Host-dbcloud_csrf"
)

// SessionTTL is how long a console sign-in lasts, from sign-in; there is
// no sliding renewal, so a stolen cookie dies on schedule.
const SessionTTL = 8 * time.Hour

// TokenPath is where command-line clients exchange codes and refresh
// tokens: the original's CLI derives it from its gateway_url (console
// origin + /api).
const TokenPath = "/api/idp/external/cli/token"

// Handler serves the console and OAuth pages, and hands the API's paths to
// the API handler.
type Handler struct {
	cloud  *cloud.Cloud
	oauth  *oauth.Server
	api    http.Handler
	logger *slog.Logger
	tmpl   map[string]*template.Template
	mux    *http.ServeMux
	signin *signinLimits
	// once holds forms' answers for the page they redirect to (once.go).
	once *onceStore
	// caPEM is the CA the Connect tab offers (connect.go) and the SQL
	// editor checks services with (sql.go); nil: none.
	caPEM []byte
	// sqlCreds are the SQL editor's credentials (sql.go).
	sqlCreds *sqlCredentials
	// live counts the live pages' event streams (live.go).
	live *liveStreams
}

// New returns the handler of the whole origin: api answers the API's
// paths (/public/api/v1/..., /healthz, /readyz), the rest is the console's.
func New(cloud *cloud.Cloud, srv *oauth.Server, api http.Handler, logger *slog.Logger) *Handler {
	if logger == nil {
		logger = slog.Default()
	}
	h := &Handler{cloud: cloud, oauth: srv, api: api, logger: logger, mux: http.NewServeMux(), signin: newSigninLimits(), once: newOnceStore(), sqlCreds: newSQLCredentials(), live: newLiveStreams()}
	h.tmpl = parseTemplates()
	static, _ := fs.Sub(staticFS, "static")
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("POST "+TokenPath, h.token)
	h.mux.HandleFunc("GET /signin", h.signinPage)
	h.mux.HandleFunc("POST /signin", h.signinPost)
	h.mux.HandleFunc("POST /signout", h.session(h.signout))
	h.mux.HandleFunc("POST /signout/everywhere", h.session(h.signoutEverywhere))
	h.mux.HandleFunc("GET /oauth/authorize", h.authorizePage)
	h.mux.HandleFunc("POST /oauth/authorize", h.session(h.authorizePost))
	h.mux.HandleFunc("GET /oauth/code/success", h.successPage)
	h.routes()
	return h
}

// ServeHTTP sends the API's paths to the API and the rest to the console,
// with the security headers every console answer carries.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	if strings.HasPrefix(p, "/public/") || p == "/healthz" || p == "/readyz" {
		h.api.ServeHTTP(w, r)
		return
	}
	hd := w.Header()
	hd.Set("Content-Security-Policy", csp(p))
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Strict-Transport-Security", "max-age=31536000")
	if !strings.HasPrefix(p, "/static/") {
		hd.Set("Cache-Control", "no-store")
	}
	if _, pattern := h.mux.Handler(r); pattern == "" && !strings.HasPrefix(p, "/static/") {
		h.render(w, r, http.StatusNotFound, "error", page{Title: "Not found", Error: "There is no page " + p + " here."})
		return
	}
	h.mux.ServeHTTP(w, r)
}

// csp is the Content-Security-Policy: scripts and styles from this origin
// only, never inline. The approval form alone may end in a redirect to the
// client's loopback address, which form-action must allow.
func csp(path string) string {
	formAction := "'self'"
	if path == "/oauth/authorize" {
		formAction += " http://localhost:* http://127.0.0.1:* http://[::1]:*"
	}
	return "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
		"form-action " + formAction + "; frame-ancestors 'none'; base-uri 'none'"
}

// session wraps a handler that needs a signed-in user: it reads the
// session cookie, checks the CSRF token of state-changing requests, and
// puts the user in the request's context as the principal.
func (h *Handler) session(next func(w http.ResponseWriter, r *http.Request, s *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, err := h.readSession(r)
		if err != nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/signin?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			h.render(w, r, http.StatusUnauthorized, "error", page{Error: "Your session has ended; sign in again."})
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if !sameToken(r.PostFormValue("csrf"), s.principal.Token.CSRF) {
				h.render(w, r, http.StatusForbidden, "error", page{Error: "The form was stale or not from this console (CSRF check failed); reload the page and try again."})
				return
			}
		}
		r = r.WithContext(cloud.NewContextWithPrincipal(r.Context(), s.principal))
		next(w, r, s)
	}
}

type session struct {
	principal *dbcloud.Principal
	secret    string
}

func (h *Handler) readSession(r *http.Request) (*session, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil, errors.New("no session")
	}
	p, err := h.cloud.AuthenticateToken(r.Context(), dbcloud.TokenSession, c.Value)
	if err != nil {
		return nil, err
	}
	return &session{principal: p, secret: c.Value}, nil
}

func sameToken(a, b string) bool {
	return a != "" && b != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

func setCookie(w http.ResponseWriter, name, value string, maxAge time.Duration) {
	c := &http.Cookie{Name: name, Value: value, Path: "/", HttpOnly: true, Secure: true, SameSite: http.SameSiteLaxMode}
	if maxAge > 0 {
		c.MaxAge = int(maxAge / time.Second)
	} else {
		c.MaxAge = -1
	}
	http.SetCookie(w, c)
}

func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// preCSRF returns the anti-forgery token of a visitor who has no session
// yet (the sign-in form: login CSRF would sign a victim in as the
// attacker), kept in a cookie and echoed by the form (double submit).
func preCSRF(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(preCSRFCookie); err == nil && len(c.Value) >= 32 {
		return c.Value
	}
	v := randomToken()
	setCookie(w, preCSRFCookie, v, time.Hour)
	return v
}

func checkPreCSRF(r *http.Request) bool {
	c, err := r.Cookie(preCSRFCookie)
	return err == nil && sameToken(c.Value, r.PostFormValue("csrf"))
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// signinLimits slows down failed sign-ins, per account and per client
// address. Only failures spend from the buckets, and they guard the
// password form only: API keys and tokens never pass here, so no amount of
// guessing locks out a valid key, and a correct password is refused only
// while an account's or address's budget is spent (a delay, not a lock).
type signinLimits struct {
	mu      sync.Mutex
	account map[string]*rate.Limiter
	address map[string]*rate.Limiter
	swept   time.Time
}

func newSigninLimits() *signinLimits {
	return &signinLimits{account: map[string]*rate.Limiter{}, address: map[string]*rate.Limiter{}, swept: time.Now()}
}

// Budgets: 5 failures per account, then one per 20 seconds; 20 per
// address, then one per 3 seconds.
const (
	accountBurst = 5
	addressBurst = 20
)

var (
	accountRate = rate.Every(20 * time.Second)
	addressRate = rate.Every(3 * time.Second)
)

func (l *signinLimits) limiters(email, ip string) (*rate.Limiter, *rate.Limiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Since(l.swept) > 10*time.Minute {
		// A limiter that has refilled holds nothing worth keeping.
		for _, m := range []map[string]*rate.Limiter{l.account, l.address} {
			for k, lim := range m {
				if lim.Tokens() >= float64(lim.Burst()) {
					delete(m, k)
				}
			}
		}
		l.swept = time.Now()
	}
	email = strings.ToLower(strings.TrimSpace(email))
	a, ok := l.account[email]
	if !ok {
		a = rate.NewLimiter(accountRate, accountBurst)
		l.account[email] = a
	}
	b, ok := l.address[ip]
	if !ok {
		b = rate.NewLimiter(addressRate, addressBurst)
		l.address[ip] = b
	}
	return a, b
}

// blocked reports how long the account or address must wait, or 0.
func (l *signinLimits) blocked(email, ip string) time.Duration {
	a, b := l.limiters(email, ip)
	now := time.Now()
	wait := time.Duration(0)
	for _, lim := range []*rate.Limiter{a, b} {
		if lim.TokensAt(now) < 1 {
			need := time.Duration((1 - lim.TokensAt(now)) / float64(lim.Limit()) * float64(time.Second))
			wait = max(wait, need)
		}
	}
	return wait
}

// failed spends one failure from both budgets.
func (l *signinLimits) failed(email, ip string) {
	a, b := l.limiters(email, ip)
	a.Allow()
	b.Allow()
}
