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
// with the project's services revision (dbcloud.RevisionServices) read
// before they were read from the store. Reading a service and encoding it
// (and a list of thousands) costs far more than reading one counter, and
// the counter moves in the same transaction as every write to a service
// or replica set of the project, on every control plane sharing the
// store, so an answer is kept exactly as long as it is still right.
type encodedCache struct {
	mu    sync.Mutex
	m     map[encodedKey]encodedEntry
	bytes int
}

// encodedKey names an answer: a service (or replica set) of a project,
// or with service "" the project's list.
type encodedKey struct{ project, service string }

type encodedEntry struct {
	rev  int64
	body encodedBody
}

func (c *encodedCache) get(k encodedKey, rev int64) encodedBody {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[k]; ok && e.rev == rev {
		return e.body
	}
	return nil
}

func (c *encodedCache) put(k encodedKey, rev int64, body encodedBody) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[k]; ok {
		if old.rev > rev {
			return // a newer answer is kept already
		}
		c.bytes -= len(old.body)
	}
	if c.m == nil || c.bytes+len(body) > maxEncodedBytes {
		c.m, c.bytes = make(map[encodedKey]encodedEntry), 0
	}
	c.m[k] = encodedEntry{rev: rev, body: body}
	c.bytes += len(body)
}

// encodedRead answers a read of the project's services from the cache when
// the project's services have not changed since it was kept, and else
// with what load returns, encoded and kept. The counter is read (and the
// caller authorised) before load reads the store: see ServicesRevision.
func (h *Handler) encodedRead(r *http.Request, k encodedKey, load func() (any, error)) (int, any, error) {
	rev, ok, err := h.cloud.ServicesRevision(r.Context(), k.project)
	if err != nil {
		return 0, nil, err
	}
	if ok {
		if b := h.encoded.get(k, rev); b != nil {
			return http.StatusOK, b, nil
		}
	}
	out, err := load()
	if err != nil {
		return 0, nil, err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return 0, nil, err
	}
	body := encodedBody(append(b, '\n'))
	if ok {
		h.encoded.put(k, rev, body)
	}
	return http.StatusOK, body, nil
}
