package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	goruntime "runtime"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"dbcloud/internal/chaos"
)

// chaosOp is one API request of the chaos test and what an answer means
// for the model.
type chaosOp struct {
	name         string
	method, path string
	body         any
	// apply records the answer in the model; it runs with c.mu held.
	apply func(code int, raw []byte, retried bool)
	// after, if set, checks what the answer promised at once.
	after func(code int)
}

// run picks one operation with rng, sends it, and records the answer.
func (c *chaosRun) run(r, i int, rng *rand.Rand) {
	// Like a user, look first: a service busy with an operation refuses
	// most changes, so it is mostly left alone (not always: refusals are
	// part of the mix). With the server down, nothing is known to be busy.
	var list []chaos.APIService
	busy := map[string]bool{}
	if code, err := c.get(c.services(), &list); err == nil && code == 200 {
		for _, a := range list {
			switch a.Status {
			case "READY", "PAUSED", "UNSTABLE":
			default:
				busy[a.ServiceID] = true
			}
		}
	}
	c.mu.Lock()
	op := c.pick(rng, busy)
	c.mu.Unlock()
	code, raw, retried := c.request(op.method, op.path, op.body, fmt.Sprintf("chaos-%d-%d-%d", c.seed, r, i))
	c.mu.Lock()
	c.ops++
	if retried {
		c.retried++
	}
	if code >= 200 && code < 300 {
		c.accepted++
	} else {
		c.refused++
	}
	op.apply(code, raw, retried)
	c.mu.Unlock()
	if op.after != nil {
		op.after(code)
	}
	note := ""
	if retried {
		note = " (after a retry with the same Idempotency-Key)"
	}
	if code >= 300 {
		var e struct{ Code string }
		json.Unmarshal(raw, &e)
		note += " " + e.Code
	}
	c.t.Logf("round %d op %d: %s -> %d%s", r, i+1, op.name, code, note)
}

// pick chooses an operation among those the model says may be accepted,
// weighted so that every kind occurs and heavy ones (HA) stay rare. The
// server may still refuse it (a service busy with an earlier operation):
// refusals are part of the mix.
func (c *chaosRun) pick(rng *rand.Rand, busy map[string]bool) chaosOp {
	evenBusy := rng.IntN(4) == 0
	type cand struct {
		weight int
		op     func() chaosOp
	}
	var cands []cand
	add := func(w int, targets []*chaos.Service, op func(*chaos.Service) chaosOp) {
		if len(targets) > 0 {
			cands = append(cands, cand{w, func() chaosOp { return op(targets[rng.IntN(len(targets))]) }})
		}
	}
	live := c.m.Live()
	where := func(f func(*chaos.Service) bool) []*chaos.Service {
		var out []*chaos.Service
		for _, s := range live {
			if f(s) && (evenBusy || !busy[s.ID]) && !c.reserved[s.ID] {
				out = append(out, s)
			}
		}
		return out
	}
	running := func(s *chaos.Service) bool { return s.Running }
	// With the most services alive, the way to a delete (pooler off, no
	// replicas, DEV) is favoured, so that services keep coming and going.
	full := 1
	if len(live) < c.maxLive {
		w := 3
		if len(live) < 2 {
			w = 10
		}
		cands = append(cands, cand{w, func() chaosOp { return c.opCreate(rng) }})
		add(2, where(running), c.opFork)
	} else {
		full = 3
	}
	noHA := len(where(func(s *chaos.Service) bool { return s.Replicas > 0 })) == 0
	add(3*full, where(func(s *chaos.Service) bool { return s.Env == "DEV" }), c.opDelete)
	add(2, where(running), c.opStop)
	add(3, where(func(s *chaos.Service) bool { return !s.Running }), c.opStart)
	add(2, where(func(*chaos.Service) bool { return true }), c.opResize)
	if goruntime.NumCPU() < 32 { // a host this size holds no 32000/128 instance
		add(1, where(func(*chaos.Service) bool { return true }), c.opResizeBeyond)
	}
	add(2, where(running), func(s *chaos.Service) chaosOp { return c.opPassword(s, rng) })
	add(1, where(func(s *chaos.Service) bool { return s.Env == "DEV" }), c.opEnvironment)
	add(full, where(func(s *chaos.Service) bool { return s.Env == "PROD" }), c.opEnvironment)
	// The pooler toggles in any environment (decisions.md section 5), also
	// on a service busy or UNSTABLE: disabling is a correction.
	add(2, where(func(s *chaos.Service) bool { return !s.Pooler }), c.opPooler)
	add(full, where(func(s *chaos.Service) bool { return s.Pooler }), c.opPooler)
	add(1, where(func(s *chaos.Service) bool { return s.Running && s.VPC == "" }), c.opVPC)
	add(1, where(func(s *chaos.Service) bool { return s.Running && s.VPC != "" }), c.opVPC)
	if noHA {
		add(1, where(func(s *chaos.Service) bool { return s.Running }), c.opHA)
	}
	add(2*full, where(func(s *chaos.Service) bool { return s.Replicas > 0 && s.Running }), c.opHA)
	cands = append(cands, cand{1, func() chaosOp { return c.opRenameVPC() }})
	total := 0
	for _, cd := range cands {
		total += cd.weight
	}
	n := rng.IntN(total)
	for _, cd := range cands {
		if n < cd.weight {
			return cd.op()
		}
		n -= cd.weight
	}
	panic("unreachable")
}

func (c *chaosRun) svcPath(s *chaos.Service, action string) string {
	p := c.services() + "/" + s.ID
	if action != "" {
		p += "/" + action
	}
	return p
}

func accepted(code int) bool { return code >= 200 && code < 300 }

func (c *chaosRun) opCreate(rng *rand.Rand) chaosOp {
	c.serial++
	env := "DEV"
	if rng.IntN(3) == 0 {
		env = "PROD" // on the way to a pooler or HA
	}
	name := fmt.Sprintf("chaos-%d", c.serial)
	return chaosOp{
		name: "create " + name + " " + env, method: "POST", path: c.services(),
		body: map[string]any{"name": name, "cpu_millis": "shared", "environment_tag": env},
		apply: func(code int, raw []byte, _ bool) {
			if accepted(code) {
				c.addService(raw, &chaos.Service{Name: name, Running: true, Size: chaos.Shared, Env: env})
			}
		},
	}
}

// opFork forks a running service as of now. The fork must hold every row
// the parent had acknowledged before the fork was asked for.
func (c *chaosRun) opFork(parent *chaos.Service) chaosOp {
	c.serial++
	name := fmt.Sprintf("chaos-%d-fork", c.serial)
	rows := maps.Clone(parent.Rows)
	return chaosOp{
		name: "fork NOW of " + parent.ID, method: "POST", path: c.svcPath(parent, "forkService"),
		body: map[string]any{"fork_strategy": "NOW", "name": name, "cpu_millis": "shared", "memory_gbs": "shared"},
		apply: func(code int, raw []byte, _ bool) {
			if accepted(code) {
				c.addService(raw, &chaos.Service{Name: name, Running: true, Size: chaos.Shared, Env: "DEV", Rows: rows})
			}
		},
	}
}

// addService records a created service from the create's answer, which
// must carry the initial password, also when it came only after a retry.
func (c *chaosRun) addService(raw []byte, s *chaos.Service) {
	var a chaos.APIService
	if err := json.Unmarshal(raw, &a); err != nil || a.ServiceID == "" {
		c.t.Errorf("create answered %s", raw)
		return
	}
	s.ID = a.ServiceID
	if a.InitialPassword != "" {
		s.Passwords = []string{a.InitialPassword}
	} else {
		// The password is sealed with the create in one transaction, so
		// even a retry after a crash between commit and answer has it.
		c.immediate = append(c.immediate, chaos.Violation{Invariant: chaos.Agrees, Service: s.ID,
			Detail: "a create was answered without its initial_password"})
	}
	if a.Endpoint != nil {
		s.Endpoint = *a.Endpoint
	}
	c.m.Add(s)
}

func (c *chaosRun) opDelete(s *chaos.Service) chaosOp {
	return chaosOp{
		name: "delete " + s.ID, method: "DELETE", path: c.svcPath(s, ""),
		apply: func(code int, _ []byte, retried bool) {
			// A 404 to a retry: the first attempt was accepted and is done.
			if accepted(code) || code == 404 && retried {
				s.Deleted = true
			}
		},
	}
}

func (c *chaosRun) opStop(s *chaos.Service) chaosOp {
	return chaosOp{name: "stop " + s.ID, method: "POST", path: c.svcPath(s, "stop"),
		apply: func(code int, _ []byte, _ bool) {
			if accepted(code) {
				s.Running = false
			}
		}}
}

func (c *chaosRun) opStart(s *chaos.Service) chaosOp {
	return chaosOp{name: "start " + s.ID, method: "POST", path: c.svcPath(s, "start"),
		apply: func(code int, _ []byte, _ bool) {
			if accepted(code) {
				s.Running = true
			}
		}}
}

// opResize flips between the shared size and 500/2 (2 GiB of memory at
// most per service: the host has room for all of them).
func (c *chaosRun) opResize(s *chaos.Service) chaosOp {
	to, body := chaos.Small, map[string]string{"cpu_millis": "500", "memory_gbs": "2"}
	if s.Size == chaos.Small {
		to, body = chaos.Shared, map[string]string{"cpu_millis": "shared", "memory_gbs": "shared"}
	}
	return chaosOp{name: "resize " + s.ID + " to " + to.String(), method: "POST", path: c.svcPath(s, "resize"), body: body,
		apply: func(code int, _ []byte, _ bool) {
			if accepted(code) {
				s.Size = to
			}
		}}
}

// opResizeBeyond asks for the largest size, which this host cannot hold:
// it must be refused with nothing changed (issue 14), never accepted.
func (c *chaosRun) opResizeBeyond(s *chaos.Service) chaosOp {
	return chaosOp{name: "resize " + s.ID + " to 32000/128 (beyond the host)", method: "POST", path: c.svcPath(s, "resize"),
		body: map[string]string{"cpu_millis": "32000", "memory_gbs": "128"},
		apply: func(code int, raw []byte, _ bool) {
			if accepted(code) {
				c.immediate = append(c.immediate, chaos.Violation{Invariant: chaos.Agrees, Service: s.ID,
					Detail: fmt.Sprintf("a resize to 32000/128, beyond this host, was accepted (%d)", code)})
			}
			var e struct{ Code string }
			if code == 409 && json.Unmarshal(raw, &e) == nil && e.Code != "CAPACITY_EXCEEDED" && e.Code != "OPERATION_IN_PROGRESS" {
				c.immediate = append(c.immediate, chaos.Violation{Invariant: chaos.Agrees, Service: s.ID,
					Detail: "a resize beyond the host was refused with " + e.Code + ", not CAPACITY_EXCEEDED"})
			}
		}}
}

// opPassword sets a new password. Its answer is final only when the first
// attempt got one: a retry refused (the service turned busy meanwhile) may
// follow a first attempt that took effect, so then either may be in force.
func (c *chaosRun) opPassword(s *chaos.Service, rng *rand.Rand) chaosOp {
	pw := randomPassword(rng)
	return chaosOp{name: "updatePassword " + s.ID, method: "POST", path: c.svcPath(s, "updatePassword"),
		body: map[string]string{"password": pw},
		apply: func(code int, _ []byte, retried bool) {
			switch {
			case accepted(code):
				s.Passwords = []string{pw}
			case retried:
				s.Passwords = append(s.Passwords, pw)
			}
		},
		after: func(code int) {
			if code == 204 {
				c.checkPassword(s, pw)
			}
		}}
}

// checkPassword holds updatePassword to its promise: in effect before the
// 204 (decisions.md). Only a refusal of the password (28P01) counts: the
// service may be restarting under a kill. A failover to a standby that had
// not replayed the change may refuse it for a moment, so the refusal must
// last to count.
func (c *chaosRun) checkPassword(s *chaos.Service, pw string) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.Connect(ctx, chaos.DSN(s.Endpoint, pw, c.boot.CAFile))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			return // not a verdict on the password
		}
		if time.Now().After(deadline) {
			c.mu.Lock()
			c.immediate = append(c.immediate, chaos.Violation{Invariant: chaos.Agrees, Service: s.ID,
				Detail: "updatePassword answered 204, but the new password is refused (28P01) for 15 s after"})
			c.mu.Unlock()
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func randomPassword(rng *rand.Rand) string {
	const letters = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	b := make([]byte, 20)
	for i := range b {
		b[i] = letters[rng.IntN(len(letters))]
	}
	return string(b)
}

func (c *chaosRun) opEnvironment(s *chaos.Service) chaosOp {
	to := "PROD"
	if s.Env == "PROD" {
		to = "DEV"
	}
	return chaosOp{name: "setEnvironment " + s.ID + " " + to, method: "POST", path: c.svcPath(s, "setEnvironment"),
		body: map[string]string{"environment": to},
		apply: func(code int, _ []byte, _ bool) {
			if accepted(code) {
				s.Env = to
			}
		}}
}

func (c *chaosRun) opPooler(s *chaos.Service) chaosOp {
	action, to := "enablePooler", true
	if s.Pooler {
		action, to = "disablePooler", false
	}
	return chaosOp{name: action + " " + s.ID, method: "POST", path: c.svcPath(s, action),
		apply: func(code int, _ []byte, _ bool) {
			if accepted(code) {
				s.Pooler = to
			}
		}}
}

func (c *chaosRun) opVPC(s *chaos.Service) chaosOp {
	action, to := "attachToVPC", c.vpcID
	if s.VPC != "" {
		action, to = "detachFromVPC", ""
	}
	return chaosOp{name: action + " " + s.ID, method: "POST", path: c.svcPath(s, action),
		body: map[string]string{"vpc_id": c.vpcID},
		apply: func(code int, _ []byte, _ bool) {
			if accepted(code) {
				s.VPC = to
			}
		}}
}

// opHA adds one synchronous standby, or removes it. Synchronous, so that
// a failover after a postmaster kill keeps every acknowledged commit.
func (c *chaosRun) opHA(s *chaos.Service) chaosOp {
	to := 1
	if s.Replicas > 0 {
		to = 0
	}
	return chaosOp{name: fmt.Sprintf("setHA %s %d", s.ID, to), method: "POST", path: c.svcPath(s, "setHA"),
		body: map[string]int{"replica_count": to, "sync_replica_count": to},
		apply: func(code int, _ []byte, _ bool) {
			if accepted(code) {
				s.Replicas = to
			}
		}}
}

func (c *chaosRun) opRenameVPC() chaosOp {
	c.serial++
	name := fmt.Sprintf("chaos-net-%d", c.serial)
	return chaosOp{name: "rename VPC to " + name, method: "POST", path: "/projects/" + c.boot.ProjectID + "/vpcs/" + c.vpcID + "/rename",
		body: map[string]string{"name": name},
		apply: func(code int, _ []byte, _ bool) {
			if accepted(code) {
				c.m.VPCs[c.vpcID] = name
			}
		}}
}

// createVPC makes the VPC services attach to. Its CIDR is data only: no
// packet is ever sent to it.
func (c *chaosRun) createVPC() {
	var vpc struct{ ID string }
	code, raw, _ := c.request("POST", "/projects/"+c.boot.ProjectID+"/vpcs",
		map[string]string{"name": "chaos-net", "cidr": "10.0.0.0/16", "region_code": "local"}, "chaos-vpc")
	if code != 201 || json.Unmarshal(raw, &vpc) != nil {
		c.t.Fatalf("create VPC: %d %s", code, raw)
	}
	c.vpcID = vpc.ID
	c.m.VPCs[vpc.ID] = "chaos-net"
}

// request sends one API request as a careful client does: with an
// Idempotency-Key and, when no answer comes (the server was killed under
// it, or is not back yet) or the answer is a 500, again with the same key
// until an answer comes. It returns the answer and whether it took a retry.
func (c *chaosRun) request(method, path string, body any, key string) (int, []byte, bool) {
	var payload []byte
	if body != nil {
		payload, _ = json.Marshal(body)
	}
	deadline := time.Now().Add(*chaosSettle)
	// With several planes, requests spread over them, and a retry goes to
	// the next: the same key answers the same on every plane.
	first := int(c.requests.Add(1))
	for attempt := 0; ; attempt++ {
		base := c.bases[(first+attempt)%len(c.bases)]
		req, _ := http.NewRequest(method, base+path, bytes.NewReader(payload))
		req.SetBasicAuth(c.boot.AccessKey, c.boot.SecretKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := c.client.Do(req)
		if err == nil {
			raw, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err == nil && res.StatusCode != 500 {
				return res.StatusCode, raw, attempt > 0
			}
			if err == nil {
				c.t.Logf("%s %s: 500 %s; retrying", method, path, raw)
			}
		}
		if time.Now().After(deadline) {
			c.t.Errorf("%s %s: no answer within %v", method, path, *chaosSettle)
			return 0, nil, true
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// get reads a resource; no retry (settle polls).
func (c *chaosRun) get(path string, out any) (int, error) {
	var res *http.Response
	var err error
	for _, base := range c.bases { // the first plane that answers
		req, _ := http.NewRequest("GET", base+path, nil)
		req.SetBasicAuth(c.boot.AccessKey, c.boot.SecretKey)
		if res, err = c.client.Do(req); err == nil {
			break
		}
	}
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	if res.StatusCode == 200 && out != nil {
		return 200, json.Unmarshal(raw, out)
	}
	return res.StatusCode, nil
}

// recoverPasswords gives services whose initial password was lost (their
// create was answered only by a retry) a password of the client's.
func (c *chaosRun) recoverPasswords() {
	c.mu.Lock()
	var lost []*chaos.Service
	for _, s := range c.m.Live() {
		if len(s.Passwords) == 0 {
			lost = append(lost, s)
		}
	}
	c.mu.Unlock()
	for _, s := range lost {
		var a chaos.APIService
		if code, err := c.get(c.svcPath(s, ""), &a); err != nil || code != 200 || a.Status != "READY" {
			continue
		}
		c.serial++
		pw := fmt.Sprintf("recovered-%d-%d", c.seed, c.serial)
		code, _, _ := c.request("POST", c.svcPath(s, "updatePassword"), map[string]string{"password": pw}, "chaos-recover-"+pw)
		if code == 204 {
			c.mu.Lock()
			s.Passwords = []string{pw}
			c.mu.Unlock()
			c.t.Logf("service %s: its create's answer was lost; set a new password", s.ID)
		}
	}
}

// retire takes one step towards deleting s, as a user would: a service
// with a pooler, replicas or PROD cannot be deleted yet.
func (c *chaosRun) retire(s *chaos.Service, i int) {
	var a chaos.APIService
	code, err := c.get(c.svcPath(s, ""), &a)
	if err != nil {
		return
	}
	key := fmt.Sprintf("chaos-teardown-%s-%d", s.ID, i)
	var op chaosOp
	c.mu.Lock()
	switch {
	case code == 404:
		s.Deleted = true
	case a.Status == "DELETING":
	case a.ConnectionPooler != nil:
		s.Pooler = true // what the API shows is what the next step undoes
		op = c.opPooler(s)
	case a.Replicas() > 0 && a.Status == "PAUSED":
		s.Running = false // setHA needs it READY
		op = c.opStart(s)
	case a.Replicas() > 0:
		s.Replicas = a.Replicas()
		op = c.opHA(s)
	case a.Metadata.Environment == "PROD":
		s.Env = "PROD"
		op = c.opEnvironment(s)
	default:
		op = c.opDelete(s)
	}
	c.mu.Unlock()
	if op.apply == nil {
		return
	}
	code, raw, retried := c.request(op.method, op.path, op.body, key)
	c.mu.Lock()
	op.apply(code, raw, retried)
	c.mu.Unlock()
}

// write commits rows to random running services until ctx ends, and
// records each row whose commit was acknowledged. It runs beside the
// operations and the kills, so commits meet stops, restarts and crashes.
func (c *chaosRun) write(ctx context.Context, rng *rand.Rand) {
	conns := map[string]*pgx.Conn{}
	defer func() {
		for _, conn := range conns {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		time.Sleep(time.Duration(10+rng.IntN(50)) * time.Millisecond)
		c.mu.Lock()
		var targets []*chaos.Service
		for _, s := range c.m.Live() {
			if s.Running && len(s.Passwords) == 1 && s.Endpoint.Port != 0 {
				targets = append(targets, s)
			}
		}
		if len(targets) == 0 {
			c.mu.Unlock()
			continue
		}
		s := targets[rng.IntN(len(targets))]
		id, ep, pw := s.ID, s.Endpoint, s.Password()
		c.mu.Unlock()
		conn := conns[id]
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			var err error
			conn, err = pgx.Connect(cctx, chaos.DSN(ep, pw, c.boot.CAFile))
			if err == nil {
				_, err = conn.Exec(cctx, "CREATE TABLE IF NOT EXISTS "+chaos.Table+" (id bigint PRIMARY KEY, payload text NOT NULL)")
			}
			cancel()
			if err != nil {
				if conn != nil {
					conn.Close(context.Background())
				}
				continue
			}
			conns[id] = conn
		}
		row := c.nextRow.Add(1)
		payload := chaos.RowPayload(c.seed, row)
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := conn.Exec(qctx, "INSERT INTO "+chaos.Table+" (id, payload) VALUES ($1, $2)", row, payload)
		cancel()
		if err != nil {
			conn.Close(context.Background())
			delete(conns, id)
			continue
		}
		c.mu.Lock()
		s.Rows[row] = payload
		c.acked++
		c.mu.Unlock()
	}
}
