package dbcloud

import "context"

// Revisions is implemented by stores that count their changes. A scope's
// counter grows in the same transaction as every write to what the scope
// covers, and never goes back, so a reader that read counter N before it
// read the data may answer from what it read for as long as the counter
// still reads N. Because the counter lives in the store, this holds across
// every control plane sharing it. A store may answer the counters from
// memory: then its own commits move them before the write returns, and
// another process's as soon as the store learns of them
// (docs/multi-plane.md).
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

// RevisionService is the scope of one service and its read replica sets:
// what GetService of that service shows. Every write under it also moves
// RevisionServices of its project. A busy project's counter moves with
// any of its services (usage is written every few seconds for each
// running one), so a view of an idle service kept under its own counter
// stays good while the others change.
func RevisionService(projectID, serviceID string) string {
	return "services/" + projectID + "/" + serviceID
}
