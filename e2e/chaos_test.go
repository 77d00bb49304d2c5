package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/internal/chaos"
	"dbcloud/postgres"
	"dbcloud/sqlite"
)

// The chaos test runs by default as a short, fixed-seed run (CI); `make
// chaos` runs it longer with a seed of its own.
var (
	chaosRounds   = flag.Int("chaos.rounds", 3, "rounds of TestChaos; 0 skips it")
	chaosSeed     = flag.Uint64("chaos.seed", 11, "seed of every random choice of TestChaos; 0 picks one from the clock")
	chaosServices = flag.Int("chaos.services", 4, "most services alive at once in TestChaos")
	chaosSettle   = flag.Duration("chaos.settle", 3*time.Minute, "how long TestChaos waits for the invariants to hold after a round")
	// A time budget, for a long run on a machine of unknown speed.
	chaosFor = flag.Duration("chaos.for", 0, "start no round after this long (0: no limit); the rounds run are reported")
	// Two planes cost more per round; CI runs a couple.
	chaosPlanesRounds = flag.Int("chaos.planes.rounds", 2, "rounds of TestChaos_TwoPlanes; 0 skips it")
	// The disk fills under dbcloud at a moment of each round.
	chaosDiskRounds = flag.Int("chaos.disk.rounds", 2, "rounds of TestChaos_DiskFull; 0 skips it")
)

// TestChaos runs rounds of random API operations while dbcloud, and
// postmasters, are killed with SIGKILL at random moments; after each round
// dbcloud runs again, and the test waits for the invariants of
// internal/chaos to hold (every accepted request finished, no orphans, the
// store agrees with what runs, acknowledged rows intact), reporting those
// that do not within -chaos.settle. A writer keeps committing rows to the
// running services meanwhile. Every random choice (operations, targets,
// kill moments) comes from the seed: a seed replays the same choices,
// though the machine's timing decides where exactly a kill lands.
func TestChaos(t *testing.T) {
	if *chaosRounds <= 0 {
		t.Skip("-chaos.rounds is 0")
	}
	s := newServer(t)
	runChaos(t, *chaosRounds, []*server{s}, chaosSetup{})
}

// TestChaos_DiskFull is TestChaos with dbcloud's data directory on a
// filesystem of its own that fills up, for a moment of each round chosen
// by the seed, as a tenant filling the host would (unprivileged: the root
// reserve stays dbcloud's), and is freed again. The invariants are
// TestChaos's: what was accepted completes once there is room.
func TestChaos_DiskFull(t *testing.T) {
	if *chaosDiskRounds <= 0 {
		t.Skip("-chaos.disk.rounds is 0")
	}
	dir := mountImage(t, "ext4", "8G")
	// The runtime stays on that ext4 (no storage image: the disk that
	// fills is the services' own), with limits the 8 GiB admit beside the
	// host's 4 GiB reserve.
	s := newServerIn(t, dir, "--storage-image-gib", "0", "--storage-shared-mib", "512", "--storage-mib-per-memory-gib", "256")
	runChaos(t, *chaosDiskRounds, []*server{s}, chaosSetup{diskDir: dir})
}

// TestChaos_TwoPlanes is TestChaos with two control planes on one
// PostgreSQL store and one runtime directory (docs/multi-plane.md):
// requests go to either plane (a careful client tries the other when one
// does not answer), and each round kills one of them, chosen by the seed.
// The invariants are TestChaos's.
func TestChaos_TwoPlanes(t *testing.T) {
	if *chaosPlanesRounds <= 0 {
		t.Skip("-chaos.planes.rounds is 0")
	}
	p := newPlanes(t)
	a := p.plane("plane-a", nil)
	b := p.plane("plane-b", a)
	runChaos(t, *chaosPlanesRounds, []*server{a, b}, chaosSetup{dsn: p.dsn})
}

// chaosSetup is what a chaos test adds to TestChaos's rounds.
type chaosSetup struct {
	// dsn is the PostgreSQL store several planes share ("": one plane
	// on SQLite).
	dsn string
	// diskDir, when set, is the filesystem under dbcloud that each round
	// fills for a moment.
	diskDir string
	// quotaMB, when set, is the storage limit of a shared service; each
	// round a tenant writes past it (chaos_quota_test.go). With diskDir
	// also set, a round has one of the two moments or neither.
	quotaMB int64
	// replay is the command that replays a run, with the seed and the
	// rounds as %d verbs ("": make chaos, or TestChaos_TwoPlanes's).
	replay string
}

// runChaos runs rounds against the planes (one, or several on the store
// at setup.dsn) and reports the violations.
func runChaos(t *testing.T, nRounds int, planes []*server, setup chaosSetup) {
	dsn, diskDir := setup.dsn, setup.diskDir
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()%1_000_000_000) + 1
	}
	replay := fmt.Sprintf("make chaos SEED=%d ROUNDS=%d", seed, nRounds)
	if len(planes) > 1 {
		replay = fmt.Sprintf("go test ./e2e -run '^TestChaos_TwoPlanes$' -v -chaos.seed=%d -chaos.planes.rounds=%d", seed, nRounds)
	}
	if setup.replay != "" {
		replay = fmt.Sprintf(setup.replay, seed, nRounds)
	}
	t.Logf("chaos: seed %d, %d rounds, at most %d services, %d control planes (replay: %s)",
		seed, nRounds, *chaosServices, len(planes), replay)
	begin := time.Now()
	s := planes[0]
	c := &chaosRun{t: t, s: s, planes: planes, dsn: dsn, seed: seed, m: chaos.NewModel(), seen: map[string]bool{},
		client: s.client, maxLive: *chaosServices, diskDir: diskDir, quotaMB: setup.quotaMB, reserved: map[string]bool{}}
	for _, p := range planes {
		c.bases = append(c.bases, p.baseURL)
	}
	c.boot.ProjectID, c.boot.AccessKey, c.boot.SecretKey, c.boot.CAFile = s.boot.ProjectID, s.boot.AccessKey, s.boot.SecretKey, s.boot.CAFile
	c.createVPC()
	rounds := 0
	for r := 1; r <= nRounds; r++ {
		if *chaosFor > 0 && time.Since(begin) > *chaosFor {
			t.Logf("chaos: -chaos.for %v has passed: no more rounds after %d", *chaosFor, rounds)
			break
		}
		rounds++
		if !c.round(r) {
			break // later rounds would start from a broken state
		}
	}
	if len(c.violations) == 0 {
		c.teardown()
	}
	t.Logf("chaos: seed %d: %d rounds, %d kills of dbcloud, %d of postmasters, %d operations (%d accepted, %d refused, %d answered only after a retry), %d rows acknowledged, %d violations, %v",
		seed, rounds, c.kills, c.pmKills, c.ops, c.accepted, c.refused, c.retried, c.acked, len(c.violations), time.Since(begin).Round(time.Second))
	for _, v := range c.violations {
		t.Errorf("violation: %s", v)
	}
	if len(c.violations) > 0 {
		// The data directory goes with the test; its log is the evidence.
		// A file of this run's own: runs in parallel (two checkouts)
		// must not overwrite each other's evidence.
		for i, p := range planes {
			if f, err := os.CreateTemp("", fmt.Sprintf("dbcloud-chaos-%d-plane%d-*.log", seed, i)); err == nil {
				raw, _ := os.ReadFile(filepath.Join(p.dir, "server.log"))
				if _, err := f.Write(raw); err == nil {
					t.Logf("dbcloud's log is kept in %s", f.Name())
				}
				f.Close()
			}
		}
	}
}

// chaosRun is one chaos test: the server, the model of what the client was
// told, and counts for the summary.
type chaosRun struct {
	t *testing.T
	s *server // the first plane: its runtime directory is every plane's
	// planes are the control planes; more than one share a PostgreSQL
	// store at dsn.
	planes  []*server
	dsn     string
	seed    uint64
	maxLive int
	// diskDir, when set, is the filesystem under dbcloud that each round
	// fills for a moment.
	diskDir string
	// quotaMB, when set, is a shared service's storage limit, which a
	// tenant writes past in each round; reserved are the services the
	// round's operations leave alone meanwhile (guarded by mu).
	quotaMB  int64
	reserved map[string]bool
	// client, bases and boot are the servers', copied once: the harness
	// rewrites their fields on every start while requests are in flight.
	// (Planes share a CA, so one client trusts all.)
	client *http.Client
	bases  []string
	boot   struct{ ProjectID, AccessKey, SecretKey, CAFile string }

	// store is dbcloud's store, read beside it (operations and port
	// claims are not in the API).
	store dbcloud.Store

	// mu guards m: the operations and the writer change it concurrently.
	mu    sync.Mutex
	m     *chaos.Model
	vpcID string

	nextRow    atomic.Int64
	requests   atomic.Int64 // spreads requests over the planes
	acked      int          // rows whose commit was acknowledged
	serial     int          // names and idempotency keys
	kills      int
	pmKills    int
	ops        int
	accepted   int
	refused    int
	retried    int
	seen       map[string]bool
	violations []string
	// immediate are violations seen as an answer came, not after a round.
	immediate []chaos.Violation
}

func (c *chaosRun) services() string { return "/projects/" + c.boot.ProjectID + "/services" }

// round runs one round and reports whether the invariants held after it.
func (c *chaosRun) round(r int) bool {
	t := c.t
	// One source per concern, each from the seed and the round: the kill
	// moments do not shift when an operation is refused, and the writer
	// (which runs on its own clock) does not shift the operations.
	opsRng := rand.New(rand.NewPCG(c.seed, uint64(r)*4))
	killRng := rand.New(rand.NewPCG(c.seed, uint64(r)*4+1))
	writeRng := rand.New(rand.NewPCG(c.seed, uint64(r)*4+2))

	nOps := 3 + opsRng.IntN(5)
	killAt := time.Duration(killRng.IntN(4000)) * time.Millisecond
	pmAt := time.Duration(-1)
	if killRng.IntN(2) == 0 {
		pmAt = time.Duration(killRng.IntN(4000)) * time.Millisecond
	}
	pmPick := killRng.Uint64()
	againAt := time.Duration(-1)
	if killRng.IntN(4) == 0 {
		againAt = time.Duration(killRng.IntN(1500)) * time.Millisecond
	}
	victim := 0
	if len(c.planes) > 1 { // drawn last: one plane replays TestChaos's seeds
		victim = killRng.IntN(len(c.planes))
	}
	fullAt, fullFor := time.Duration(-1), time.Duration(0)
	if c.diskDir != "" { // drawn after the others, for the same reason
		fullAt = time.Duration(killRng.IntN(4000)) * time.Millisecond
		fullFor = time.Duration(500+killRng.IntN(3000)) * time.Millisecond
	}
	quotaAt, quotaPick := time.Duration(-1), uint64(0)
	if c.quotaMB > 0 { // drawn after the others, for the same reason
		quotaAt = time.Duration(killRng.IntN(3000)) * time.Millisecond
		quotaPick = killRng.Uint64()
	}
	if fullAt >= 0 && quotaAt >= 0 { // drawn last, for the same reason
		fullAt, quotaAt = oneMoment(killRng.IntN(10), fullAt, quotaAt)
	}
	plan := fmt.Sprintf("round %d: %d operations; kill dbcloud at %v", r, nOps, killAt)
	if len(c.planes) > 1 {
		plan = fmt.Sprintf("round %d: %d operations; kill plane %d at %v", r, nOps, victim, killAt)
	}
	if pmAt >= 0 {
		plan += fmt.Sprintf(", a postmaster at %v", pmAt)
	}
	if againAt >= 0 {
		plan += fmt.Sprintf(", dbcloud again %v after its restart", againAt)
	}
	if fullAt >= 0 {
		plan += fmt.Sprintf(", the disk full at %v for %v", fullAt, fullFor)
	}
	if quotaAt >= 0 {
		plan += fmt.Sprintf(", a tenant writes past its limit from %v", quotaAt)
	}
	t.Log(plan)

	ctx, stopWriter := context.WithCancel(context.Background())
	writerDone := make(chan struct{})
	go func() { defer close(writerDone); c.write(ctx, writeRng) }()
	opsDone := make(chan struct{})
	go func() {
		defer close(opsDone)
		for i := range nOps {
			time.Sleep(time.Duration(opsRng.IntN(800)) * time.Millisecond)
			c.run(r, i, opsRng)
		}
	}()

	begin := time.Now()
	type event struct {
		at   time.Duration
		kill func()
	}
	events := []event{{killAt, func() { c.killServer(r, c.planes[victim], againAt) }}}
	if pmAt >= 0 {
		events = append(events, event{pmAt, func() { c.killPostmaster(r, pmPick) }})
	}
	var filler string
	if fullAt >= 0 {
		events = append(events, event{fullAt, func() {
			filler = fillDisk(t, c.diskDir, fmt.Sprintf("filler-%d", r))
			t.Logf("round %d: the disk is full", r)
		}}, event{fullAt + fullFor, func() {
			if err := os.RemoveAll(filler); err != nil {
				t.Errorf("free the disk: %v", err)
			}
			t.Logf("round %d: the disk has room again", r)
		}})
	}
	var fill *quotaFill
	if quotaAt >= 0 {
		events = append(events, event{quotaAt, func() { fill = c.startFill(r, quotaPick) }})
	}
	slices.SortFunc(events, func(a, b event) int { return int(a.at - b.at) })
	for _, e := range events {
		// Not a wait for a condition: this is the moment the seed chose.
		time.Sleep(time.Until(begin.Add(e.at)))
		e.kill()
	}
	<-opsDone
	stopWriter()
	<-writerDone

	if fill != nil {
		<-fill.done
		if fill.svc == nil {
			fill = nil
		}
	}

	settleBegin := time.Now()
	v, looks := c.settle()
	settled := time.Since(settleBegin)
	c.mu.Lock()
	v, c.immediate = append(c.immediate, v...), nil
	c.mu.Unlock()
	for _, x := range v {
		if !c.seen[x.String()] {
			c.seen[x.String()] = true
			c.violations = append(c.violations, fmt.Sprintf("round %d: %s", r, x))
			t.Logf("round %d: VIOLATION %s", r, x)
		}
	}
	if fill != nil && len(v) == 0 {
		for _, x := range c.checkFill(r, fill) {
			c.violations = append(c.violations, fmt.Sprintf("round %d: %s", r, x))
			t.Logf("round %d: VIOLATION %s", r, x)
			v = append(v, chaos.Violation{Invariant: chaos.StorageLimit, Detail: x})
		}
	}
	c.mu.Lock()
	live := len(c.m.Live())
	c.mu.Unlock()
	t.Logf("round %d: done after %v (settled in %v, %d looks), %d services live, %d violations",
		r, time.Since(begin).Round(time.Millisecond), settled.Round(time.Millisecond), looks, live, len(v))
	return len(v) == 0
}

// killServer kills dbcloud with SIGKILL and starts it again; with again
// >= 0 it kills it once more that long into its recovery.
func (c *chaosRun) killServer(r int, s *server, again time.Duration) {
	s.kill()
	c.kills++
	s.start()
	c.t.Logf("round %d: killed dbcloud %s (SIGKILL) and started it again", r, filepath.Base(s.dir))
	if again < 0 {
		return
	}
	time.Sleep(again) // the moment the seed chose
	s.kill()
	c.kills++
	s.start()
	c.t.Logf("round %d: killed dbcloud again %v into its recovery", r, again)
}

// killPostmaster kills, with SIGKILL, one postmaster of a service that
// should be running, found through its pid file and checked against the
// process table so that a reused PID is never hit.
func (c *chaosRun) killPostmaster(r int, pick uint64) {
	c.mu.Lock()
	var ids []string
	for _, s := range c.m.Live() {
		if s.Running {
			ids = append(ids, s.ID)
		}
	}
	c.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	id := ids[pick%uint64(len(ids))]
	files, _ := filepath.Glob(filepath.Join(c.s.runtimeDir(), "services", id, "*", "pgdata", "postmaster.pid"))
	if len(files) == 0 {
		c.t.Logf("round %d: no postmaster of %s to kill", r, id)
		return
	}
	slices.Sort(files)
	f := files[(pick>>32)%uint64(len(files))]
	raw, err := os.ReadFile(f)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	if err != nil || pid <= 1 {
		return
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := strings.Split(string(cmdline), "\x00")
	if len(args) < 3 || args[1] != "-D" || args[2] != filepath.Dir(f) {
		return // not running, or the PID is someone else's by now
	}
	if syscall.Kill(pid, syscall.SIGKILL) == nil {
		c.pmKills++
		c.t.Logf("round %d: killed postmaster %d of %s instance %s (SIGKILL)", r, pid, id, filepath.Base(filepath.Dir(filepath.Dir(f))))
	}
}

// settle waits until the invariants hold, or -chaos.settle has passed, and
// returns the violations of the last look and how many looks it took.
// Some take time legitimately: a killed postmaster is restarted, a
// failover settles.
func (c *chaosRun) settle() ([]chaos.Violation, int) {
	deadline := time.Now().Add(*chaosSettle)
	for looks := 1; ; looks++ {
		c.recoverPasswords()
		w, err := c.observe()
		var v []chaos.Violation
		if err == nil {
			c.mu.Lock()
			v = chaos.Check(c.m, w)
			c.mu.Unlock()
			if len(v) == 0 {
				return nil, looks
			}
		}
		if time.Now().After(deadline) {
			if err != nil {
				v = append(v, chaos.Violation{Invariant: chaos.Finished, Detail: "cannot observe: " + err.Error()})
			}
			return v, looks
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// observe reads the API, the store and the host, and logs in.
func (c *chaosRun) observe() (*chaos.World, error) {
	w := &chaos.World{API: map[string]chaos.APIService{}, VPCs: map[string]string{}}
	var list []chaos.APIService
	if code, err := c.get(c.services(), &list); err != nil || code != 200 {
		return nil, fmt.Errorf("list services: %d %v", code, err)
	}
	for _, a := range list {
		w.API[a.ServiceID] = a
	}
	var vpcs []struct{ ID, Name string }
	if code, err := c.get("/projects/"+c.boot.ProjectID+"/vpcs", &vpcs); err != nil || code != 200 {
		return nil, fmt.Errorf("list VPCs: %d %v", code, err)
	}
	for _, v := range vpcs {
		w.VPCs[v.ID] = v.Name
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c.store == nil {
		var st dbcloud.Store
		var err error
		if c.dsn != "" {
			st, err = postgres.Open(ctx, c.dsn)
		} else {
			st, err = sqlite.Open(ctx, filepath.Join(c.s.dir, "dbcloud.db"))
		}
		if err != nil {
			return nil, fmt.Errorf("open the store: %w", err)
		}
		c.store = st
		c.t.Cleanup(func() { st.Close() })
	}
	if err := chaos.ObserveStore(ctx, c.store, w); err != nil {
		return nil, fmt.Errorf("read the store: %w", err)
	}
	c.mu.Lock()
	ids := slices.Clone(c.m.Order)
	c.mu.Unlock()
	if err := chaos.ObserveHost(c.s.runtimeDir(), ids, w); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	chaos.ObserveLogins(ctx, c.boot.CAFile, c.m, w)
	return w, nil
}

// teardown deletes every service as a user would (pooler off, no
// replicas, DEV, delete) and checks that nothing of them is left.
func (c *chaosRun) teardown() {
	deadline := time.Now().Add(*chaosSettle)
	for i := 0; ; i++ {
		c.mu.Lock()
		live := c.m.Live()
		c.mu.Unlock()
		if len(live) == 0 {
			break
		}
		if time.Now().After(deadline) {
			c.violations = append(c.violations, fmt.Sprintf("teardown: %d services could not be deleted within %v", len(live), *chaosSettle))
			return
		}
		for _, s := range live {
			c.retire(s, i)
		}
		time.Sleep(200 * time.Millisecond)
	}
	v, _ := c.settle()
	for _, x := range v {
		c.violations = append(c.violations, "after deleting every service: "+x.String())
		c.t.Logf("teardown: VIOLATION %s", x)
	}
	c.t.Logf("teardown: every service deleted")
}

// oneMoment keeps at most one of a round's disk-full and quota moments
// (never both: a full disk refuses the tenant's writes for reasons of its
// own, and the limit's checks would judge the disk), from a draw in
// [0, 10): a disk-full moment in three rounds of ten, a quota moment in
// one (the dearest by far: the tenant writes hundreds of MB, then gets out
// again), neither in six.
func oneMoment(draw int, fullAt, quotaAt time.Duration) (time.Duration, time.Duration) {
	switch {
	case draw < 3:
		return fullAt, -1
	case draw == 3:
		return -1, quotaAt
	default:
		return -1, -1
	}
}
