package cloud

import (
	"context"
	"sync"
	"time"

	"dbcloud"
)

// KeyUseInterval is how often at most a key's last use is written, per key
// and control plane: "last used" is shown to the minute, and a write per
// request would cost the API a store write on every call.
const KeyUseInterval = time.Minute

// keyUses remembers when each key's use was last written by this process.
type keyUses struct {
	mu      sync.Mutex
	written map[string]time.Time
}

// due reports whether a use of the key at now is to be written, and if so
// counts it as written.
func (k *keyUses) due(accessKey string, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if last, ok := k.written[accessKey]; ok && now.Sub(last) < KeyUseInterval {
		return false
	}
	if k.written == nil || len(k.written) >= maxCredentials {
		// Past the bound, starting over costs each key one more write.
		k.written = make(map[string]time.Time)
	}
	k.written[accessKey] = now
	return true
}

// forget drops a key's note, so that a use whose write failed is written
// by the next request.
func (k *keyUses) forget(accessKey string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.written, accessKey)
}

// recordKeyUse writes that the key authenticated a request now, unless
// this process wrote a use of it within KeyUseInterval. Its own short
// transaction, after authentication's read: nothing slow runs inside it. A
// failed write is logged and does not fail the request.
func (c *Cloud) recordKeyUse(ctx context.Context, accessKey string) {
	now := c.now()
	if !c.keyUses.due(accessKey, now) {
		return
	}
	err := c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		return tx.TouchAPIKey(accessKey, now)
	})
	if err != nil {
		c.keyUses.forget(accessKey)
		c.Logger.Warn("record key use", "key", accessKey, "err", err)
	}
}
