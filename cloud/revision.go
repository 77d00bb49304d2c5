package cloud

import (
	"context"

	"dbcloud"
)

type revisionsKey struct{}

// revisionSnapshot holds counters read at the start of a request.
type revisionSnapshot struct {
	scopes []string
	revs   []int64
}

// WithRevisions reads the counters of scopes at once (from the store's
// memory, or in one query) and returns ctx carrying them, so that the
// request's cached reads (credentials, then services) agree on them. The
// counters are read before anything they cover, as caching requires.
// Without counters in the store it returns ctx as it is.
func (c *Cloud) WithRevisions(ctx context.Context, scopes ...string) (context.Context, error) {
	revs := c.revisions()
	if revs == nil {
		return ctx, nil
	}
	got, err := revs.Revisions(ctx, scopes...)
	if err != nil {
		return nil, err
	}
	return context.WithValue(ctx, revisionsKey{}, &revisionSnapshot{scopes: scopes, revs: got}), nil
}

// revision returns scope's counter: from the request's snapshot if it
// holds it, else read now. ok is false when the store keeps no counters.
func (c *Cloud) revision(ctx context.Context, scope string) (rev int64, ok bool, err error) {
	if snap, _ := ctx.Value(revisionsKey{}).(*revisionSnapshot); snap != nil {
		for i, s := range snap.scopes {
			if s == scope {
				return snap.revs[i], true, nil
			}
		}
	}
	revs := c.revisions()
	if revs == nil {
		return 0, false, nil
	}
	got, err := revs.Revisions(ctx, scope)
	if err != nil {
		return 0, false, err
	}
	return got[0], true, nil
}

// revisions returns the store's change counters, or nil if it keeps none
// (then nothing read is kept either).
func (c *Cloud) revisions() dbcloud.Revisions {
	r, _ := dbcloud.UnwrapStore(c.Store).(dbcloud.Revisions)
	return r
}
