package cloud

import (
	"context"
	"crypto/subtle"
	"sync"

	"dbcloud"
)

// maxCredentials bounds the credentials a Cloud keeps verified: past it
// the cache starts over, which costs each caller one full check.
const maxCredentials = 4096

// credentialCache keeps the principals of credentials that passed the full
// check, each with the RevisionCredentials counter read before that check.
// An entry answers only while the counter still reads the same: any write
// to a user, membership, project, key or token, on any control plane
// sharing the store, moves the counter, and the next request is checked in
// full again. So a revoked key is refused at its next request everywhere,
// and the cache only saves the store reads of an unchanged credential.
type credentialCache struct {
	mu sync.Mutex
	m  map[string]credentialEntry
}

type credentialEntry struct {
	rev int64
	// secret is the hash of the secret that passed, compared in constant
	// time: an entry never lets a wrong secret through. Empty for tokens,
	// which are keyed by their hash already.
	secret []byte
	p      *dbcloud.Principal
}

// get returns a copy of the principal kept for key if it was verified at
// rev with the same secret hash.
func (c *credentialCache) get(key string, rev int64, secret []byte) *dbcloud.Principal {
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if !ok || e.rev != rev || subtle.ConstantTimeCompare(e.secret, secret) != 1 {
		return nil
	}
	return e.p.Clone()
}

func (c *credentialCache) put(key string, rev int64, secret []byte, p *dbcloud.Principal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCredentials {
		c.m = make(map[string]credentialEntry)
	}
	c.m[key] = credentialEntry{rev: rev, secret: secret, p: p.Clone()}
}

// cachedCredential authenticates from the cache: it reads the credentials
// counter and returns the kept principal if the counter has not moved
// since it was verified. Otherwise it returns nil and the counter, under
// which check's answer may be kept (check runs after the counter is read,
// so what it read is never older than the counter says).
func (c *Cloud) cachedCredential(ctx context.Context, key string, secret []byte, check func() (*dbcloud.Principal, error)) (*dbcloud.Principal, error) {
	rev, ok, err := c.revision(ctx, dbcloud.RevisionCredentials)
	if err != nil {
		return nil, err
	}
	if !ok {
		return check()
	}
	if p := c.credentials.get(key, rev, secret); p != nil {
		return p, nil
	}
	p, err := check()
	if err != nil {
		return nil, err
	}
	c.credentials.put(key, rev, secret, p)
	return p, nil
}
