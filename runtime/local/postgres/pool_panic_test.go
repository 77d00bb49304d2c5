package postgres

import (
	"context"
	"sync/atomic"
	"testing"

	"dbcloud/runtime/local/internal/localtest"
	"dbcloud/runtime/local/internal/osuser"
)

// panickyIdentities panics in the first Ensure calls, as a bug in the OS
// user code would, and then makes the identity.
type panickyIdentities struct {
	Identities
	panics atomic.Int32
}

func (p *panickyIdentities) Ensure(ctx context.Context, key string) (osuser.Identity, error) {
	if p.panics.Add(-1) >= 0 {
		var m map[string]int
		m[key]++ // a nil map written
	}
	return p.Identities.Ensure(ctx, key)
}

// TestPool_PanicPreparingCluster: a panic while the refill prepares a
// cluster is that cluster's failure, retried with the pool's backoff: the
// pool fills, and the control plane is still there.
func TestPool_PanicPreparingCluster(t *testing.T) {
	m, _, _ := newIdentityPool(t, localtest.Base(t), "dbcp", 1, 1)
	ids := &panickyIdentities{Identities: m.Identities}
	ids.panics.Store(1)
	m.Identities = ids
	if err := m.Open(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, m, 1)
	if n := ids.panics.Load(); n >= 0 {
		t.Errorf("the panicking Ensure was not called (%d left)", n+1)
	}
}
