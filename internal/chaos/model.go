// Package chaos holds what the chaos test (e2e/chaos_test.go) expects and
// what it observes, and the checker that compares the two. The checker is a
// pure function of a Model (what the client was told) and a World (what the
// API, the store and the host show), so every invariant can be proven to
// fire on a fabricated world as well as on a broken build.
package chaos

import "fmt"

// Size is a service size as the API takes it; CPU "shared" is the shared
// size, which has no memory amount.
type Size struct {
	CPU string // "shared" or millicores, e.g. "500"
	Mem string // GiB, e.g. "2"; "" for shared
}

// Shared is the cheapest size; Small is the dedicated size the chaos test
// resizes to and from (500 millicores, 2 GiB).
var (
	Shared = Size{CPU: "shared"}
	Small  = Size{CPU: "500", Mem: "2"}
)

func (s Size) String() string {
	if s.Mem == "" {
		return s.CPU
	}
	return s.CPU + "/" + s.Mem
}

// SharedBuffers is what `SHOW shared_buffers` must answer for the size: an
// oracle written down here rather than computed by the product's code, so a
// product that derives the wrong setting is caught.
func (s Size) SharedBuffers() string {
	switch s {
	case Shared:
		return "16MB"
	case Small:
		return "512MB"
	}
	return ""
}

// Service is what the client was told about one service: the effects of
// every request the API accepted (2xx), in the order it accepted them.
type Service struct {
	ID   string
	Name string
	// Endpoint is where the create's answer said to connect.
	Endpoint Endpoint
	// Deleted: a delete was accepted, so the service must end up gone.
	Deleted bool
	// Running: READY is expected, else PAUSED.
	Running  bool
	Size     Size
	Env      string // DEV or PROD
	Pooler   bool
	VPC      string // ID of the attached VPC, "" when detached
	Replicas int
	// Passwords holds tsdbadmin's password; more than one while the outcome
	// of an updatePassword is unknown (any of them may be in force). Empty
	// when the create's answer (and its initial password) was lost.
	Passwords []string
	// Rows are the rows a commit acknowledged: id -> payload. A fork
	// inherits the rows its parent had acknowledged before the fork was
	// asked for.
	Rows map[int64]string
}

// Password is the password to log in with first.
func (s *Service) Password() string {
	if len(s.Passwords) == 0 {
		return ""
	}
	return s.Passwords[0]
}

// Model is everything the client was told, across rounds.
type Model struct {
	// Services by ID, including deleted ones (to check they stay gone).
	Services map[string]*Service
	// Order is the IDs in the order the services were created.
	Order []string
	// VPCs maps a VPC's ID to the name it must have.
	VPCs map[string]string
}

// NewModel returns an empty model.
func NewModel() *Model {
	return &Model{Services: map[string]*Service{}, VPCs: map[string]string{}}
}

// Add records a service whose create (or fork) was accepted.
func (m *Model) Add(s *Service) {
	if s.Rows == nil {
		s.Rows = map[int64]string{}
	}
	if _, ok := m.Services[s.ID]; !ok {
		m.Order = append(m.Order, s.ID)
	}
	m.Services[s.ID] = s
}

// Live returns the services not deleted, in creation order.
func (m *Model) Live() []*Service {
	var out []*Service
	for _, id := range m.Order {
		if s := m.Services[id]; !s.Deleted {
			out = append(out, s)
		}
	}
	return out
}

// RowPayload is the content of row id: derived from the id, so a row that
// comes back with other content is caught too.
func RowPayload(seed uint64, id int64) string {
	return fmt.Sprintf("chaos-%d-%d-%x", seed, id, uint64(id)*0x9e3779b97f4a7c15^seed)
}
