package console

import (
	"net/http"
	"sync"
	"time"

	"dbcloud"
)

// Post/redirect/get: a form's answer (its notice, and a secret made by it:
// a password, a key, a credential's connection string) is kept for the
// session that sent the form and shown by the page it is redirected to,
// once. A reload of that page then sends nothing again and shows the
// secret no more.

// onceTTL bounds how long an answer waits for its page.
const onceTTL = 5 * time.Minute

// onceStore holds the answers waiting for their page, in this process's
// memory: a secret is never written anywhere. A redirect served by
// another control plane, or after a restart, shows the page without it
// (the user resets the password or makes another key).
type onceStore struct {
	mu sync.Mutex
	m  map[string]onceEntry
}

type onceEntry struct {
	f       flash
	expires time.Time
}

func newOnceStore() *onceStore { return &onceStore{m: map[string]onceEntry{}} }

func (o *onceStore) put(key string, f flash, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, e := range o.m {
		if now.After(e.expires) {
			delete(o.m, k)
		}
	}
	o.m[key] = onceEntry{f: f, expires: now.Add(onceTTL)}
}

func (o *onceStore) take(key string, now time.Time) (flash, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.m[key]
	delete(o.m, key)
	if !ok || now.After(e.expires) {
		return flash{}, false
	}
	return e.f, true
}

// onceKey names the session's waiting answer, by its secret's hash.
func onceKey(s *session) string { return string(dbcloud.HashToken(s.secret)) }

// showOnce keeps f for the session's next page and redirects to it.
func (h *Handler) showOnce(w http.ResponseWriter, r *http.Request, s *session, to string, f flash) {
	f.status = http.StatusOK
	h.once.put(onceKey(s), f, time.Now())
	http.Redirect(w, r, to, http.StatusSeeOther)
}
