package http

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"dbcloud"
)

// authenticate reads Basic or Bearer credentials (decisions.md section 4)
// and returns the caller and the secret it presented. The secret is needed
// only to seal idempotent responses for that same caller; it is never stored.
//
// Failed attempts are counted per client address and, past the budget,
// answered 429 instead of 401. Only failures are judged: a valid key is
// never refused because others at the same address (a NAT, a CI runner)
// failed.
func (h *Handler) authenticate(ctx context.Context, r *http.Request) (*dbcloud.Principal, string, error) {
	ip := clientIP(r)
	if token, ok := bearerToken(r.Header.Get("Authorization")); ok {
		p, err := h.cloud.AuthenticateToken(ctx, dbcloud.TokenAccess, token)
		if dbcloud.ErrorKindOf(err) == dbcloud.KindUnauthorized {
			return nil, "", h.limits.authFailed(ip, err)
		}
		return p, token, err
	}
	access, secret, ok := credentials(r.Header.Get("Authorization"))
	if !ok {
		return nil, "", h.limits.authFailed(ip, dbcloud.Errorf(dbcloud.KindUnauthorized,
			"Send an API key as Authorization: Basic base64(ACCESS_KEY:SECRET_KEY) or Bearer ACCESS_KEY:SECRET_KEY."))
	}
	p, err := h.cloud.Authenticate(ctx, access, secret)
	if err != nil {
		if dbcloud.ErrorKindOf(err) == dbcloud.KindUnauthorized {
			return nil, "", h.limits.authFailed(ip, err)
		}
		return nil, "", err
	}
	return p, secret, nil
}

// bearerToken returns a user's OAuth access token: a Bearer value with no
// colon, which tells it from an ACCESS_KEY:SECRET_KEY pair.
func bearerToken(header string) (string, bool) {
	scheme, value, found := strings.Cut(header, " ")
	value = strings.TrimSpace(value)
	if !found || !strings.EqualFold(scheme, "bearer") || value == "" || strings.Contains(value, ":") {
		return "", false
	}
	return value, true
}

// credentials parses the Authorization header into an access key and secret.
func credentials(header string) (access, secret string, ok bool) {
	scheme, value, found := strings.Cut(header, " ")
	if !found {
		return "", "", false
	}
	value = strings.TrimSpace(value)
	switch strings.ToLower(scheme) {
	case "basic":
		raw, err := base64.StdEncoding.DecodeString(value)
		if err != nil {
			return "", "", false
		}
		value = string(raw)
	case "bearer":
	default:
		return "", "", false
	}
	access, secret, ok = strings.Cut(value, ":")
	return access, secret, ok && access != "" && secret != ""
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// limiters holds a token bucket per credential and, for failed
// authentication, per client address; and the count of event streams
// each credential holds.
type limiters struct {
	cfg      Config
	mu       sync.Mutex
	keys     map[string]*bucket
	failures map[string]*bucket
	swept    time.Time
	streams  *holdCap
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
}

func newLimiters(cfg Config) *limiters {
	return &limiters{cfg: cfg, keys: map[string]*bucket{}, failures: map[string]*bucket{}, swept: time.Now(),
		streams: newHoldCap(cfg.MaxStreamsPerCredential)}
}

func (l *limiters) get(m map[string]*bucket, k string, r float64, burst int) *rate.Limiter {
	now := time.Now()
	if now.Sub(l.swept) > time.Minute {
		// Forget idle buckets; a full bucket holds no state worth keeping.
		for _, mm := range []map[string]*bucket{l.keys, l.failures} {
			for key, b := range mm {
				if now.Sub(b.seen) > 10*time.Minute {
					delete(mm, key)
				}
			}
		}
		l.swept = now
	}
	b, ok := m[k]
	if !ok {
		b = &bucket{lim: rate.NewLimiter(rate.Limit(r), burst)}
		m[k] = b
	}
	b.seen = now
	return b.lim
}

func rateLimited(lim *rate.Limiter, what string) error {
	wait := time.Duration(float64(time.Second) / float64(lim.Limit()))
	return &dbcloud.Error{Kind: dbcloud.KindRateLimited, Message: "Too many " + what + "; retry after the time in Retry-After.", RetryAfter: wait}
}

// allow takes a token for a request of the credential.
func (l *limiters) allow(accessKey string) error {
	if l.cfg.RateLimit <= 0 {
		return nil
	}
	l.mu.Lock()
	lim := l.get(l.keys, accessKey, l.cfg.RateLimit, l.cfg.RateBurst)
	l.mu.Unlock()
	if !lim.Allow() {
		return rateLimited(lim, "requests for this API key")
	}
	return nil
}

// authFailed counts a failed attempt from the address and returns the
// error to answer: err while the address has budget left, else 429.
func (l *limiters) authFailed(ip string, err error) error {
	if l.cfg.AuthFailLimit <= 0 {
		return err
	}
	l.mu.Lock()
	lim := l.get(l.failures, ip, l.cfg.AuthFailLimit, l.cfg.AuthFailBurst)
	l.mu.Unlock()
	if !lim.Allow() {
		return rateLimited(lim, "failed authentication attempts from this address")
	}
	return err
}

// streamRetry is the Retry-After of a refused stream: a stream ends only
// when its client leaves, so there is no time at which one is sure to be
// free; this keeps a reconnecting client from spinning.
const streamRetry = 15 * time.Second

// openStream counts an event stream of the credential and returns the
// function that ends the count, or a 429 when the credential holds its
// cap already.
func (l *limiters) openStream(credential string) (release func(), err error) {
	if !l.streams.take(credential) {
		return nil, &dbcloud.Error{Kind: dbcloud.KindRateLimited, RetryAfter: streamRetry, Message: fmt.Sprintf(
			"Too many event streams open for this credential (at most %d); close one, then retry after the time in Retry-After.", l.streams.max)}
	}
	return func() { l.streams.release(credential) }, nil
}
