package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Invariant names one of the properties the chaos test holds dbcloud to.
type Invariant string

// The invariants.
const (
	// Finished: every request the API accepted reaches its end state.
	Finished Invariant = "finished"
	// NoOrphans: no process, directory, port or cgroup outlives its service.
	NoOrphans Invariant = "no-orphans"
	// Agrees: the store agrees with what runs.
	Agrees Invariant = "store-agrees"
	// DataIntact: every acknowledged row is there, with its content.
	DataIntact Invariant = "data-intact"
	// StorageLimit: a service past its storage limit is read-only with a
	// reason, the others are not, and it is writable again once its tenant
	// deleted data (checked by the e2e test itself, which does the deleting).
	StorageLimit Invariant = "storage-limit"
)

// Violation is one broken invariant.
type Violation struct {
	Invariant Invariant
	Service   string // "" when not about one service
	Detail    string
}

func (v Violation) String() string {
	if v.Service == "" {
		return fmt.Sprintf("[%s] %s", v.Invariant, v.Detail)
	}
	return fmt.Sprintf("[%s] service %s: %s", v.Invariant, v.Service, v.Detail)
}

// Check compares what the client was told (m) with what is observed (w)
// once every accepted request has had time to finish, and returns every
// violation, in a stable order.
func Check(m *Model, w *World) []Violation {
	var out []Violation
	add := func(inv Invariant, svc, format string, args ...any) {
		out = append(out, Violation{inv, svc, fmt.Sprintf(format, args...)})
	}
	live := map[string]bool{}
	for id := range w.API {
		live[id] = true
	}

	// Finished: each service shows the effect of every accepted request.
	for _, id := range m.Order {
		s := m.Services[id]
		a, listed := w.API[id]
		switch {
		case s.Deleted && listed:
			add(Finished, id, "delete was accepted, but the service is still listed (%s)", a.Status)
		case s.Deleted:
		case !listed:
			add(Finished, id, "the service was accepted and never deleted, but is not listed")
		default:
			checkService(s, a, add)
		}
	}
	for id, a := range w.API {
		if _, known := m.Services[id]; !known {
			add(Finished, id, "listed (%s), but no accepted request created it", a.Status)
		}
	}
	for id, name := range m.VPCs {
		if got, ok := w.VPCs[id]; !ok {
			add(Finished, "", "VPC %s is not listed", id)
		} else if got != name {
			add(Finished, "", "VPC %s is named %q, want %q (the accepted rename)", id, got, name)
		}
	}
	for _, op := range w.Operations {
		switch op.State {
		case "pending":
			add(Finished, op.ResourceID, "operation %s (%s) is still pending", op.ID, op.Type)
		case "failed":
			add(Finished, op.ResourceID, "operation %s (%s) failed: %s", op.ID, op.Type, op.Error)
		}
	}

	// NoOrphans: nothing outlives its service.
	for _, p := range w.Processes {
		if !live[p.ServiceID] {
			add(NoOrphans, p.ServiceID, "%s pid %d runs for a service the store does not have%s", p.Kind, p.PID, listensText(p))
		}
	}
	for _, d := range w.Dirs {
		if !live[d] {
			add(NoOrphans, d, "directory services/%s remains, the store has no such service", d)
		}
	}
	for _, g := range w.Cgroups {
		id := g[:max(0, strings.LastIndexByte(g, '-'))]
		if !live[id] {
			add(NoOrphans, id, "cgroup dbcloud/%s remains, the store has no such service", g)
		}
	}
	ports := make([]int, 0, len(w.Ports))
	for p := range w.Ports {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	for _, p := range ports {
		if owner := w.Ports[p]; !live[owner] {
			add(NoOrphans, owner, "port %d is still claimed, the store has no such service", p)
		}
	}

	// Agrees: what the store says runs, runs, as often as it says.
	byService := map[string][]Process{}
	for _, p := range w.Processes {
		byService[p.ServiceID] = append(byService[p.ServiceID], p)
	}
	for _, id := range m.Order {
		s, a := m.Services[id], w.API[id]
		if s.Deleted || !live[id] {
			continue
		}
		checkRunning(s, a, byService[id], w.Logins[id], add)
		if a.Endpoint != nil && w.Ports != nil && w.Ports[a.Endpoint.Port] != id {
			add(Agrees, id, "endpoint port %d is not claimed by the service in the store (owner %q)", a.Endpoint.Port, w.Ports[a.Endpoint.Port])
		}
	}
	slices.SortStableFunc(out, func(x, y Violation) int {
		return strings.Compare(string(x.Invariant)+x.Service, string(y.Invariant)+y.Service)
	})
	return out
}

type addFunc func(inv Invariant, svc, format string, args ...any)

// checkService compares one live service's API view with the requests
// accepted for it.
func checkService(s *Service, a APIService, add addFunc) {
	want := "READY"
	if !s.Running {
		want = "PAUSED"
	}
	if a.Status != want {
		reason := ""
		if a.StatusReason != "" {
			reason = " (" + a.StatusReason + ")"
		}
		add(Finished, s.ID, "status %s%s, want %s", a.Status, reason, want)
	}
	if a.Metadata.Environment != s.Env {
		add(Finished, s.ID, "environment %s, want %s", a.Metadata.Environment, s.Env)
	}
	if got := a.Size(); got != s.Size {
		add(Finished, s.ID, "size %s, want %s", got, s.Size)
	}
	if got := a.Replicas(); got != s.Replicas {
		add(Finished, s.ID, "ha_replicas.replica_count %d, want %d", got, s.Replicas)
	}
	if (a.ConnectionPooler != nil) != s.Pooler {
		add(Finished, s.ID, "connection_pooler shown: %v, want %v", a.ConnectionPooler != nil, s.Pooler)
	} else if s.Pooler && s.Running && a.ConnectionPooler.Endpoint == nil {
		add(Finished, s.ID, "the pooler is enabled and the service running, but no pooler endpoint is shown")
	}
	switch {
	case s.VPC == "" && a.VPCEndpoint != nil:
		add(Finished, s.ID, "detached, but vpcEndpoint %s (VPC %s) is shown", a.VPCEndpoint.Addr(), a.VPCEndpoint.VPCID)
	case s.VPC != "" && a.VPCEndpoint == nil:
		add(Finished, s.ID, "attached to VPC %s, but no vpcEndpoint is shown", s.VPC)
	case s.VPC != "" && a.VPCEndpoint.VPCID != s.VPC:
		add(Finished, s.ID, "vpcEndpoint in VPC %s, want %s", a.VPCEndpoint.VPCID, s.VPC)
	}
	if n := len(a.Resources); n != 1+s.Replicas {
		add(Agrees, s.ID, "%d resources listed, want %d (1 + %d replicas)", n, 1+s.Replicas, s.Replicas)
	}
}

// checkRunning compares the processes and logins of one live service with
// its state in the store.
func checkRunning(s *Service, a APIService, procs []Process, logins []Login, add addFunc) {
	count := map[ProcessKind]int{}
	instances := map[string]int{}
	for _, p := range procs {
		count[p.Kind]++
		if p.Kind == Postmaster {
			instances[p.Instance]++
		}
	}
	for inst, n := range instances {
		if n > 1 {
			add(Agrees, s.ID, "instance %s has %d postmasters", inst, n)
		}
	}
	if count[Proxy] > 1 {
		add(Agrees, s.ID, "%d endpoint proxies run", count[Proxy])
	}
	switch a.Status {
	case "PAUSED":
		if count[Postmaster] > 0 || count[Pooler] > 0 {
			add(Agrees, s.ID, "PAUSED, yet %d postmasters and %d poolers run", count[Postmaster], count[Pooler])
		}
		return
	case "READY":
	default:
		return // already a Finished violation; nothing to compare
	}
	if want := 1 + s.Replicas; count[Postmaster] != want {
		add(Agrees, s.ID, "READY with %d replicas, but %d postmasters run (want %d)", s.Replicas, count[Postmaster], want)
	}
	if want := btoi(s.Pooler); count[Pooler] != want {
		add(Agrees, s.ID, "READY with the pooler %s, but %d PgBouncers run", onOff(s.Pooler), count[Pooler])
	}
	if len(s.Passwords) == 0 {
		return // the create's answer was lost; nothing to log in with yet
	}
	vias := map[string]bool{"endpoint": true, "pooler": s.Pooler, "vpc": s.VPC != ""}
	for _, l := range logins {
		if !vias[l.Via] {
			continue
		}
		delete(vias, l.Via)
		if l.Err != "" {
			add(Agrees, s.ID, "TLS login as tsdbadmin via the %s with its password failed: %s", l.Via, l.Err)
			continue
		}
		if l.Via != "endpoint" {
			continue
		}
		if want := s.Size.SharedBuffers(); l.SharedBuffers != want {
			add(Finished, s.ID, "shared_buffers is %s, want %s for size %s", l.SharedBuffers, want, s.Size)
		}
		checkRows(s, l, add)
	}
	for via, want := range vias {
		if want {
			add(Agrees, s.ID, "no login via the %s was observed", via)
		}
	}
}

// checkRows reports every acknowledged row that is missing or changed.
func checkRows(s *Service, l Login, add addFunc) {
	if len(s.Rows) == 0 {
		return
	}
	if l.RowsErr != "" {
		add(DataIntact, s.ID, "%d acknowledged rows, but the table cannot be read: %s", len(s.Rows), l.RowsErr)
		return
	}
	var missing, changed []int64
	for id, payload := range s.Rows {
		got, ok := l.Rows[id]
		switch {
		case !ok:
			missing = append(missing, id)
		case got != payload:
			changed = append(changed, id)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		add(DataIntact, s.ID, "%d of %d acknowledged rows missing: %s", len(missing), len(s.Rows), idList(missing))
	}
	if len(changed) > 0 {
		slices.Sort(changed)
		add(DataIntact, s.ID, "%d acknowledged rows have other content: %s", len(changed), idList(changed))
	}
}

func idList(ids []int64) string {
	var b strings.Builder
	for i, id := range ids {
		if i == 10 {
			fmt.Fprintf(&b, " and %d more", len(ids)-10)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprint(&b, id)
	}
	return b.String()
}

func listensText(p Process) string {
	if len(p.Listens) == 0 {
		return ""
	}
	return ", listening on " + strings.Join(p.Listens, ", ")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
