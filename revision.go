package dbcloud

import "context"

// Revisions is implemented by stores that count their changes. A scope's
// counter grows in the same transaction as every write to what the scope
// covers, and never goes back, so a reader that read counter N before it
// read the data may answer from what it read for as long as the counter
// still reads N. Because the counter lives in the store, this holds across
// every control plane sharing it: a write committed on one plane moves the
// counter that the next request on any other plane reads.
type Revisions interface {
	// Revisions returns the counters of scopes, in their order, 0 for a
	// scope nothing was ever written to. It runs outside any transaction.
	Revisions(ctx context.Context, scopes ...string) ([]int64, error)
}

// RevisionCredentials is the scope of everything authentication reads:
// users, memberships, projects, API keys and user tokens.
const RevisionCredentials = "credentials"

// RevisionServices is the scope of a project's services and read replica
// sets: everything a service's view (GetService, ListServices) is made of.
func RevisionServices(projectID string) string { return "services/" + projectID }

type revisionsKey struct{}

// revisionSnapshot holds counters read at the start of a request.
type revisionSnapshot struct {
	scopes []string
	revs   []int64
}

// WithRevisions reads the counters of scopes in one query and returns ctx
// carrying them, so that the request's cached reads (credentials, then
// services) cost one store read together instead of one each. The
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
func (c *Cloud) revisions() Revisions {
	r, _ := UnwrapStore(c.Store).(Revisions)
	return r
}
