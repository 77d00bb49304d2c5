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
	// Revision returns scope's counter, 0 if nothing it covers was ever
	// written. It runs outside any transaction.
	Revision(ctx context.Context, scope string) (int64, error)
}

// RevisionCredentials is the scope of everything authentication reads:
// users, memberships, projects, API keys and user tokens.
const RevisionCredentials = "credentials"

// RevisionServices is the scope of a project's services and read replica
// sets: everything a service's view (GetService, ListServices) is made of.
func RevisionServices(projectID string) string { return "services/" + projectID }

// revisions returns the store's change counters, or nil if it keeps none
// (then nothing read is kept either).
func (c *Cloud) revisions() Revisions {
	r, _ := UnwrapStore(c.Store).(Revisions)
	return r
}
