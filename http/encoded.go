package http

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sync"
)

// maxEncodedBytes bounds the answers an encodedCache keeps; past it the
// cache starts over. A list of 10,000 services is about 4 MB.
const maxEncodedBytes = 64 << 20

// encodedBody is a complete JSON response body, newline included, that
// writeResult sends as it is. It is shared between requests: never
// append to it or change it.
type encodedBody []byte

// MarshalJSON lets an encodedBody be encoded again as what it holds (an
// idempotent response is stored encoded, for one).
func (b encodedBody) MarshalJSON() ([]byte, error) { return bytes.TrimSuffix(b, []byte("\n")), nil }

// encodedCache keeps the encoded answers of GET service and list services
// with a change counter read before they were read from the store: the
// project's services revision (dbcloud.RevisionServices), or for a service's
// own view the service's (dbcloud.RevisionService), which does not move
// when the project's other services change. Reading a service and encoding
// it (and a list of thousands) costs far more than reading one counter, and
// the counter moves in the same transaction as every write to what the
// answer shows, on every control plane sharing the store, so an answer is
// kept exactly as long as it is still right.
type encodedCache struct {
	mu    sync.Mutex
	m     map[encodedKey]encodedEntry
	bytes int
}

// encodedKey names an answer: a service (or replica set) of a project,
// or with service "" the project's list.
type encodedKey struct{ project, service string }

// encodedRevs are the counters an answer may be kept under, read before
// it was: the project's, and for GET service the service's own.
type encodedRevs struct{ project, own int64 }

func (r encodedRevs) of(own bool) int64 {
	if own {
		return r.own
	}
	return r.project
}

type encodedEntry struct {
	rev  int64
	own  bool // rev is the service's own counter, not the project's
	body encodedBody
}

func (c *encodedCache) get(k encodedKey, revs encodedRevs) encodedBody {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[k]; ok && e.rev == revs.of(e.own) {
		return e.body
	}
	return nil
}

func (c *encodedCache) put(k encodedKey, own bool, revs encodedRevs, body encodedBody) {
	rev := revs.of(own)
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[k]; ok {
		if old.own == own && old.rev > rev {
			return // a newer answer is kept already
		}
		c.bytes -= len(old.body)
	}
	if c.m == nil || c.bytes+len(body) > maxEncodedBytes {
		c.m, c.bytes = make(map[encodedKey]encodedEntry), 0
	}
	c.m[k] = encodedEntry{rev: rev, own: own, body: body}
	c.bytes += len(body)
}

// encodedRead answers a read of the project's services from the cache when
// what it shows has not changed since it was kept, and else with what load
// returns, encoded and kept under the service's own counter if load says
// own, else the project's. revs reads the counters (and authorises the
// caller) before load reads the store: see cloud.ServicesRevision.
func (h *Handler) encodedRead(k encodedKey, revs func() (encodedRevs, bool, error), load func() (body any, own bool, err error)) (int, any, error) {
	rs, ok, err := revs()
	if err != nil {
		return 0, nil, err
	}
	if ok {
		if b := h.encoded.get(k, rs); b != nil {
			return http.StatusOK, b, nil
		}
	}
	out, own, err := load()
	if err != nil {
		return 0, nil, err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return 0, nil, err
	}
	body := encodedBody(append(b, '\n'))
	if ok {
		h.encoded.put(k, own, rs, body)
	}
	return http.StatusOK, body, nil
}
