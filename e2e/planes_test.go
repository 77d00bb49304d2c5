package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud/internal/pgtest"
)

// planes is an installation of several control planes, as
// docs/multi-plane.md lays it out: one PostgreSQL store (started by the
// test), a data directory and node id per plane, one shared runtime
// directory and one CA directory.
type planes struct {
	t      testing.TB
	dsn    string
	shared string // runtime/ and ca/
	lo, hi int    // the endpoint ports, the same for every plane
	extra  []string
}

func newPlanes(t testing.TB, extra ...string) *planes {
	t.Helper()
	shared, err := os.MkdirTemp("", "dbcloud-e2e-shared-")
	if err != nil {
		t.Fatal(err)
	}
	return newPlanesIn(t, shared, extra...)
}

// newPlanesIn is newPlanes with the shared runtime and CA directories in
// shared, a directory the test made (a filesystem of its own, to fill).
func newPlanesIn(t testing.TB, shared string, extra ...string) *planes {
	t.Helper()
	srv := pgtest.MustStart(t)
	dsn, err := srv.CreateDatabase(context.Background(), "planes")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o711); err != nil {
		t.Fatal(err)
	}
	// Runs last: every plane has stopped by then.
	t.Cleanup(func() {
		stopPostmasters(t, shared)
		unmountUnder(t, shared) // the storage image the planes share
		os.RemoveAll(shared)
	})
	lo, hi := portRange(t)
	return &planes{t: t, dsn: dsn, shared: shared, lo: lo, hi: hi, extra: extra}
}

// plane starts a control plane named name. The first bootstraps the store;
// a later one is given the first's credentials (bootstrap.json), as an
// operator hands them on.
func (p *planes) plane(name string, first *server) *server {
	p.t.Helper()
	dir, err := os.MkdirTemp("", "dbcloud-e2e-plane-")
	if err != nil {
		p.t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		p.t.Fatal(err)
	}
	if first != nil {
		raw, err := os.ReadFile(filepath.Join(first.dir, "bootstrap.json"))
		if err != nil {
			p.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "bootstrap.json"), raw, 0o600); err != nil {
			p.t.Fatal(err)
		}
	}
	s := &server{t: p.t, dir: dir, listen: "127.0.0.1:" + strconv.Itoa(apiPort(p.t)), runtime: filepath.Join(p.shared, "runtime"),
		args: append([]string{"--port-min", strconv.Itoa(p.lo), "--port-max", strconv.Itoa(p.hi),
			"--store", p.dsn, "--runtime-dir", filepath.Join(p.shared, "runtime"), "--ca-dir", filepath.Join(p.shared, "ca"),
			"--node-id", name, "--pool-size", "1",
			// As for newServer: restore checks cost a scratch instance per
			// service; their own tests turn them on. The sizes' default
			// storage limits are more than a test machine's disk holds.
			"--restore-check-interval", "0", "--storage-mib-per-memory-gib", "2048"}, p.extra...)}
	p.t.Cleanup(func() {
		s.stop()
		if p.t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "server.log")); err == nil {
				var problems []string
				for _, l := range strings.Split(string(b), "\n") {
					if strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`) {
						problems = append(problems, l)
					}
				}
				p.t.Logf("%s: warnings and errors:\n%s", name, tail([]byte(strings.Join(problems, "\n")), 4000))
			}
		}
		os.RemoveAll(dir)
	})
	s.start()
	return s
}

// leaseOwner is who last took the resource's lease in the store, "" when
// it was released. (A dead plane's row stays until another takes it.)
func (p *planes) leaseOwner(ctx context.Context, db *pgx.Conn, id string) string {
	var owner string
	err := db.QueryRow(ctx, `SELECT owner FROM leases WHERE resource_id = $1`, id).Scan(&owner)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		p.t.Fatalf("read the lease of %s: %v", id, err)
	}
	return owner
}

// incompleteSnapshots lists the published snapshots under the shared
// runtime directory that lack their manifest or data.
func (p *planes) incompleteSnapshots() []string {
	var bad []string
	dirs, _ := filepath.Glob(filepath.Join(p.shared, "runtime", "services", "*", "snapshots", "*"))
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() || strings.HasPrefix(filepath.Base(d), ".") {
			continue
		}
		for _, f := range []string{"manifest.json", "data/PG_VERSION", "data/backup_label"} {
			if _, err := os.Stat(filepath.Join(d, f)); errors.Is(err, fs.ErrNotExist) {
				bad = append(bad, d+": no "+f)
			}
		}
	}
	return bad
}

// TestPlanes_TwoPlanesOneStore runs two control planes on one PostgreSQL
// store and one runtime directory: creates through both; a kill -9 of one
// while it has just accepted three creates and a resize; the other
// finishes all of it; the killed one comes back; snapshots (taken all the
// while by whichever plane holds a service's lease) are all complete, and
// a point-in-time fork inside every service's window succeeds.
func TestPlanes_TwoPlanesOneStore(t *testing.T) {
	ctx := context.Background()
	p := newPlanes(t, "--snapshot-interval", "30s", "--lease-ttl", "3s")
	a := p.plane("plane-a", nil)
	b := p.plane("plane-b", a)
	t.Cleanup(func() { // before the planes stop
		if b.cmd != nil {
			b.deleteAll()
		}
	})

	type made struct {
		id, password string
	}
	var all []made
	create := func(s *server, name string) made {
		c := s.create(map[string]any{"name": name})
		m := made{c.ServiceID, c.InitialPassword}
		all = append(all, m)
		return m
	}
	first := []made{create(a, "a1"), create(b, "b1")}
	for _, m := range first {
		b.waitStatus(m.id, "READY", 120*time.Second)
	}

	// Plane A accepts three creates, a resize and a fork, and is killed
	// while it takes a snapshot (if it takes one within a minute), the
	// other work likely in flight.
	for i := range 3 {
		create(a, "during-kill-"+strconv.Itoa(i))
	}
	if code := a.call("POST", a.services()+"/"+first[0].id+"/resize", map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}, nil); code != 202 {
		t.Fatalf("resize: %d", code)
	}
	parent, _ := a.get(first[1].id)
	f := a.mustFork(parent, map[string]any{"fork_strategy": "NOW"})
	all = append(all, made{f.ServiceID, f.InitialPassword})
	aPID := a.cmd.Process.Pid
	if tmp := p.waitSnapshotInProgress(aPID, time.Minute); tmp != "" {
		t.Logf("killing plane-a while it writes %s", tmp)
	} else {
		t.Logf("plane-a took no snapshot within a minute; killing it anyway")
	}
	a.kill()

	for _, m := range all {
		b.waitStatus(m.id, "READY", 180*time.Second)
		if pids := b.postmasters(m.id); len(pids) != 1 {
			t.Errorf("service %s: postmasters %v, want exactly one", m.id, pids)
		}
	}
	resized, _ := b.get(first[0].id)
	var sb string
	if err := b.mustConnect(resized, first[0].password).QueryRow(ctx, `SHOW shared_buffers`).Scan(&sb); err != nil || sb != "1GB" {
		t.Errorf("after the resize accepted by the killed plane: shared_buffers %q (%v), want 1GB", sb, err)
	}

	// The killed plane comes back and works alongside again.
	a.start()
	create(a, "after-restart")
	b.waitStatus(all[len(all)-1].id, "READY", 120*time.Second)

	// Every service gets a snapshot; then a row, a point in time after it,
	// and another row; a PITR fork to that point holds the first row only.
	type target struct {
		m       made
		between time.Time
	}
	var targets []target
	for _, m := range all {
		b.waitSnapshot(m.id, time.Time{}, 120*time.Second)
		svc, _ := b.get(m.id)
		db := b.mustConnect(svc, m.password)
		var between time.Time
		if _, err := db.Exec(ctx, `CREATE TABLE planes (v text); INSERT INTO planes VALUES ('first')`); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&between); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, `INSERT INTO planes VALUES ('second')`); err != nil {
			t.Fatal(err)
		}
		targets = append(targets, target{m, between.UTC()})
	}
	for i, tg := range targets {
		through := []*server{a, b}[i%2]
		parent, _ := through.get(tg.m.id)
		f := through.mustFork(parent, map[string]any{"fork_strategy": "PITR", "target_time": tg.between.Format(time.RFC3339Nano)})
		fork := b.waitStatus(f.ServiceID, "READY", 180*time.Second)
		got := queryValues(t, b.mustConnect(fork, f.InitialPassword), `SELECT v FROM planes ORDER BY v`)
		if !slices.Equal(got, []string{"first"}) {
			t.Errorf("PITR fork of %s: rows %q, want exactly first", tg.m.id, got)
		}
		if pids := b.postmasters(f.ServiceID); len(pids) != 1 {
			t.Errorf("fork %s: postmasters %v, want exactly one", f.ServiceID, pids)
		}
	}
	for _, m := range all {
		if pids := b.postmasters(m.id); len(pids) != 1 {
			t.Errorf("service %s at the end: postmasters %v, want exactly one", m.id, pids)
		}
	}
	if bad := p.incompleteSnapshots(); len(bad) > 0 {
		t.Errorf("incomplete snapshots published: %v", bad)
	}
	// What the killed plane left half-written goes with the next snapshot
	// of its service.
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		left := p.snapshotsInProgress(aPID)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the killed plane's snapshots in progress are still there: %v", left)
			break
		}
	}
}

// snapshotsInProgress lists the snapshots being written (or left half
// written) by the process pid: .tmp-NAME.PID.
func (p *planes) snapshotsInProgress(pid int) []string {
	tmp, _ := filepath.Glob(filepath.Join(p.shared, "runtime", "services", "*", "snapshots", ".tmp-*."+strconv.Itoa(pid)))
	return tmp
}

// waitSnapshotInProgress waits until the process pid is writing a
// snapshot and returns it; "" if none was seen within.
func (p *planes) waitSnapshotInProgress(pid int, within time.Duration) string {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if tmp := p.snapshotsInProgress(pid); len(tmp) > 0 {
			return tmp[0]
		}
	}
	return ""
}

var planesLeaseTTL = flag.String("planes.lease-ttl", "", "--lease-ttl of the planes of BenchmarkPlanes_Takeover (empty: the default)")

// BenchmarkPlanes_Takeover measures how long a service's work waits after
// a kill -9 of the control plane that holds its lease: from the kill to
// the other plane holding the lease (at the default --lease-ttl). Each
// round, plane A accepts a resize and is killed as soon as its lease on
// the service shows in the store; it is restarted for the next round. The
// median is reported as takeover-ms:
//
//	go test -run '^$' -bench BenchmarkPlanes_Takeover -benchtime 5x ./e2e/
func BenchmarkPlanes_Takeover(b *testing.B) {
	ctx := context.Background()
	var extra []string
	if *planesLeaseTTL != "" {
		extra = append(extra, "--lease-ttl", *planesLeaseTTL)
	}
	p := newPlanes(b, extra...)
	a := p.plane("plane-a", nil)
	other := p.plane("plane-b", a)
	b.Cleanup(func() {
		if other.cmd != nil {
			other.deleteAll()
		}
	})
	db, err := pgx.Connect(ctx, p.dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close(ctx)
	c := a.create(map[string]any{"name": "takeover"})
	other.waitStatus(c.ServiceID, "READY", 120*time.Second)
	sizes := []map[string]string{{"cpu_millis": "1000", "memory_gbs": "4"}, {"cpu_millis": "500", "memory_gbs": "2"}}
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if a.cmd == nil {
			a.start()
		}
		other.waitStatus(c.ServiceID, "READY", 120*time.Second)
		if code := a.call("POST", a.services()+"/"+c.ServiceID+"/resize", sizes[i%2], nil); code != 202 {
			b.Fatalf("resize: %d", code)
		}
		for deadline := time.Now().Add(30 * time.Second); p.leaseOwner(ctx, db, c.ServiceID) != "plane-a"; time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("plane-a never held the lease of the resized service")
			}
		}
		killed := time.Now()
		a.kill()
		for deadline := time.Now().Add(60 * time.Second); p.leaseOwner(ctx, db, c.ServiceID) != "plane-b"; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("plane-b did not take the service over within 60 s")
			}
		}
		took = append(took, time.Since(killed))
	}
	b.StopTimer()
	other.waitStatus(c.ServiceID, "READY", 120*time.Second)
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "takeover-ms")
	raw, _ := json.Marshal(took)
	b.Logf("takeover times (sorted, ns): %s", raw)
}
