package local

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"dbcloud/runtime/local/internal/localtest"
	"dbcloud/runtime/local/postgres"
	"dbcloud/runtime/local/proxy"

	"github.com/jackc/pgx/v5"

	"dbcloud"
)

// TestMain lets the test binary be the endpoint proxy, as the dbcloud
// binary is in production (the runtime starts os.Executable()).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == proxy.Command {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		if err := proxy.Run(ctx, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ackWriter inserts rows through the endpoint, one transaction each, and
// records which commits were acknowledged and when writes succeed.
type ackWriter struct {
	mu    sync.Mutex
	acked []int
	ok    []time.Time
	port  []int // the instance port that acknowledged each
	stop  chan struct{}
	done  chan struct{}
}

func startWriter(t *testing.T, svc *dbcloud.Service, password string, from int) *ackWriter {
	w := &ackWriter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		for i := from; ; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			if conn == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				c, err := pgx.Connect(ctx, tcpDSN(svc.Endpoint.Port, password, "require"))
				cancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				conn = c
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			var port int
			err := conn.QueryRow(ctx, "INSERT INTO acked VALUES ($1) RETURNING inet_server_port()", i).Scan(&port)
			cancel()
			if err != nil {
				conn.Close(context.Background())
				conn = nil
				continue
			}
			w.mu.Lock()
			w.acked = append(w.acked, i)
			w.ok = append(w.ok, time.Now())
			w.port = append(w.port, port)
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *ackWriter) finish() []int {
	close(w.stop)
	<-w.done
	return w.acked
}

// firstOKAfter is when the first write acknowledged after t by another
// instance than the one on notPort succeeded.
func (w *ackWriter) firstOKAfter(t time.Time, notPort int) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, ok := range w.ok {
		if ok.After(t) && w.port[i] != notPort {
			return ok, true
		}
	}
	return time.Time{}, false
}

// waitAcks waits until at least n writes were acknowledged after t by
// another instance than the one on notPort (0: any), so a test goes on
// once the writer has done something rather than after a fixed time.
func (w *ackWriter) waitAcks(tb testing.TB, n int, t time.Time, notPort int) {
	tb.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		w.mu.Lock()
		got := 0
		for i, ok := range w.ok {
			if ok.After(t) && w.port[i] != notPort {
				got++
			}
		}
		w.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d writes acknowledged after %v within 60 s, want %d", got, t, n)
		}
	}
}

// healthLoop does what the engine does: check every second, repair
// (EnsureService) when not running, until stop is closed.
func healthLoop(t *testing.T, rt *Runtime, svc *dbcloud.Service, stop chan struct{}) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			obs, err := rt.checkHA(context.Background(), svc, false)
			if err != nil {
				t.Logf("check: %v", err)
				continue
			}
			if obs.Running {
				continue
			}
			t.Logf("repair: %s", obs.Reason)
			if _, err := rt.ensureHA(context.Background(), svc); err != nil {
				t.Logf("repair failed: %v", err)
			}
		}
	}()
	return done
}

func roles(obs *dbcloud.Observation) string {
	var out []string
	for _, in := range obs.Instances {
		out = append(out, in.ID[strings.LastIndexByte(in.ID, '-')+1:]+":"+in.Role)
	}
	return strings.Join(out, ",")
}

func TestRuntime_HA(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several PostgreSQL instances")
	}
	rt := mustRuntime(t, localtest.Base(t))
	const password = "ha-secret-pw"
	svc := newTestService(t, rt, "hasvc", password, nil)
	t.Cleanup(func() { rt.stopProxy(context.Background(), svc.ID) }) // before DeleteService
	ctx := context.Background()

	// Created without replicas, then made HA: the primary moves behind the
	// proxy.
	mustEnsure(t, rt, svc)
	mustExec(t, svc, password, "CREATE TABLE t (v text); INSERT INTO t VALUES ('before-ha'); CREATE TABLE acked (id int PRIMARY KEY)")
	svc.Spec.Replicas, svc.Spec.SyncReplicas = 2, 1
	begin := time.Now()
	obs, err := rt.ensureHA(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("turned HA with 2 standbys in %v", time.Since(begin))
	if got := roles(obs); got != "0:primary,1:replica,2:replica" || !obs.Running {
		t.Fatalf("instances %s running %v", got, obs.Running)
	}
	st, _ := rt.loadHA(svc.ID)
	base, _ := rt.preparedBase(context.Background(), svc)
	pspec := rt.haSpec(svc, base, st, st.Primary)
	var ssn string
	c, err := rt.instances.Connect(ctx, pspec, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	c.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&ssn)
	c.Close(ctx)
	if ssn != `ANY 1 ("instance_1", "instance_2")` {
		t.Errorf("synchronous_standby_names = %q", ssn)
	}

	t.Run("ReadOnStandby", func(t *testing.T) {
		mustExec(t, svc, password, "INSERT INTO t VALUES ('on-primary')")
		standby := rt.haSpec(svc, base, st, 2)
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, err := pgx.Connect(ctx, tcpDSN(standby.Port, password, "require"))
			if err != nil {
				t.Fatal(err)
			}
			var n int
			var inRecovery bool
			c.QueryRow(ctx, "SELECT count(*), pg_is_in_recovery() FROM t WHERE v = 'on-primary'").Scan(&n, &inRecovery)
			c.Close(ctx)
			if n == 1 && inRecovery {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("row not on standby (count %d, in recovery %v)", n, inRecovery)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	failover := func(t *testing.T, from int, breakPrimary func(spec postgres.Spec)) {
		st, _ := rt.loadHA(svc.ID)
		old := rt.haSpec(svc, base, st, st.Primary)
		w := startWriter(t, svc, password, from)
		stop := make(chan struct{})
		loop := healthLoop(t, rt, svc, stop)
		// The loop ends with the subtest, also when it fails: left running,
		// it would repair the service while the cleanup deletes it.
		stopLoop := sync.OnceFunc(func() { close(stop); <-loop })
		defer stopLoop()
		w.waitAcks(t, 20, time.Time{}, 0)
		killed := time.Now()
		breakPrimary(old)
		var firstOK time.Time
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if ok, found := w.firstOKAfter(killed, old.Port); found {
				firstOK = ok
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no write succeeded within 30 s of the failure")
			}
		}
		t.Logf("failover: failure to first acknowledged write through the endpoint: %v", firstOK.Sub(killed))
		w.waitAcks(t, 20, killed, old.Port)
		acked := w.finish()
		// Wait for the repair to end with every instance back.
		var obs *dbcloud.Observation
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if obs, _ = rt.checkHA(ctx, svc, false); obs != nil && obs.Running {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not healthy again: %+v", obs)
			}
		}
		stopLoop()
		st2, _ := rt.loadHA(svc.ID)
		if st2.Primary == st.Primary {
			t.Fatalf("primary still instance %d", st.Primary)
		}
		t.Logf("instances after failover: %s; sync %v", roles(obs), st2.Sync)
		// Every acknowledged commit is on the new primary.
		c, err := connectTLS(t, svc, password)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var missing []int
		for _, id := range acked {
			var n int
			if err := c.QueryRow(ctx, "SELECT count(*) FROM acked WHERE id = $1", id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			t.Fatalf("%d of %d acknowledged commits lost: %v", len(missing), len(acked), missing)
		}
		t.Logf("%d acknowledged commits, all on the new primary", len(acked))
		var inRecovery bool
		c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
		if inRecovery {
			t.Fatal("endpoint reaches a standby")
		}
		// The former primary follows the new one.
		formerly := rt.haSpec(svc, base, st2, st.Primary)
		fc, err := rt.instances.Connect(ctx, formerly, "postgres")
		if err != nil {
			t.Fatal(err)
		}
		fc.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
		fc.Close(ctx)
		if !inRecovery {
			t.Fatalf("former primary %s is not a standby", formerly.ID)
		}
	}

	t.Run("FailoverKill9", func(t *testing.T) {
		failover(t, 0, func(spec postgres.Spec) {
			pid, ok := rt.instances.Running(spec)
			if !ok {
				t.Fatal("primary not running")
			}
			syscall.Kill(pid, syscall.SIGKILL)
		})
	})
	t.Run("FailoverDataRemoved", func(t *testing.T) {
		failover(t, 1_000_000, func(spec postgres.Spec) {
			// The postmaster goes on creating files while they are
			// removed, which RemoveAll reports as "directory not empty":
			// remove until it is gone.
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				err := os.RemoveAll(spec.PGData())
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal(err)
				}
			}
		})
	})

	// Resizes restart the standbys first when they raise a setting a hot
	// standby needs at least as high as the primary's, else the primary
	// first; either way every standby keeps replaying.
	t.Run("ResizeOrdersRestarts", func(t *testing.T) {
		startTimes := func() (primary time.Time, standbys []time.Time) {
			st, _ := rt.loadHA(svc.ID)
			for _, n := range st.Members {
				c, err := rt.instances.Connect(ctx, rt.haSpec(svc, base, st, n), "postgres")
				if err != nil {
					t.Fatal(err)
				}
				var at time.Time
				var paused string
				if err := c.QueryRow(ctx, `SELECT pg_postmaster_start_time(),
					CASE WHEN pg_is_in_recovery() THEN pg_get_wal_replay_pause_state() ELSE 'primary' END`).Scan(&at, &paused); err != nil {
					t.Fatal(err)
				}
				c.Close(ctx)
				if n == st.Primary {
					primary = at
				} else {
					if paused != "not paused" {
						t.Errorf("standby %d: replay %s", n, paused)
					}
					standbys = append(standbys, at)
				}
			}
			return primary, standbys
		}
		for _, step := range []struct {
			size          dbcloud.Size
			standbysFirst bool
		}{
			{dbcloud.Size{CPUMillis: 1000, MemoryGBs: 4}, true}, // more max_connections and workers
			{dbcloud.Size{Shared: true}, false},
		} {
			svc.Spec.Size = step.size
			if _, err := rt.ensureHA(ctx, svc); err != nil {
				t.Fatal(err)
			}
			primary, standbys := startTimes()
			for i, at := range standbys {
				if at.Before(primary) != step.standbysFirst {
					t.Errorf("resize to %+v: standby %d started %v, primary %v; want standbys first %v",
						step.size, i, at, primary, step.standbysFirst)
				}
			}
			mustExec(t, svc, password, "INSERT INTO t VALUES ('after-resize')")
		}
	})

	t.Run("LowerReplicas", func(t *testing.T) {
		svc.Spec.Replicas, svc.Spec.SyncReplicas = 1, 1
		obs, err := rt.ensureHA(ctx, svc)
		if err != nil {
			t.Fatal(err)
		}
		if len(obs.Instances) != 2 || !obs.Running {
			t.Fatalf("instances %s", roles(obs))
		}
		st, _ := rt.loadHA(svc.ID)
		for n := range 3 {
			_, err := os.Stat(filepath.Join(rt.serviceDir(svc.ID), fmt.Sprint(n)))
			if want := slices.Contains(st.Members, n); (err == nil) != want {
				t.Errorf("instance %d dir exists %v, member %v", n, err == nil, want)
			}
		}
		mustExec(t, svc, password, "INSERT INTO t VALUES ('after-lower')")
		t.Logf("instances after lowering: %s", roles(obs))
	})
}

// haTestService makes a service of replicas HA standbys, sync of them
// synchronous, with an acked (id int primary key) table made before it
// turned HA; its proxy stops before the service is deleted.
func haTestService(t *testing.T, rt *Runtime, id, password string, replicas, sync int) *dbcloud.Service {
	t.Helper()
	svc := newTestService(t, rt, id, password, nil)
	t.Cleanup(func() { rt.stopProxy(context.Background(), svc.ID) }) // before DeleteService
	mustEnsure(t, rt, svc)
	mustExec(t, svc, password, "CREATE TABLE acked (id int PRIMARY KEY)")
	svc.Spec.Replicas, svc.Spec.SyncReplicas = replicas, sync
	if _, err := rt.ensureHA(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	return svc
}

// killInstance SIGKILLs the instance's postmaster and waits until the
// runtime sees it dead.
func killInstance(t *testing.T, rt *Runtime, spec postgres.Spec) {
	t.Helper()
	pid, ok := rt.instances.Running(spec)
	if !ok {
		t.Fatalf("%s not running", spec.ID)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := rt.instances.Running(spec); !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still runs 30 s after SIGKILL", spec.ID)
		}
	}
}

// TestRuntime_HAKeepsCommitsWithoutSyncStandby: with synchronous replicas
// asked for, a primary that dies while no standby is synchronous (one is
// still being built, or has just been rebuilt) is started again rather
// than failed over to a standby that may lack acknowledged commits. The
// chaos test found acknowledged rows lost that way (a postmaster killed
// during setHA).
func TestRuntime_HAKeepsCommitsWithoutSyncStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several PostgreSQL instances")
	}
	rt := mustRuntime(t, localtest.Base(t))
	const password = "ha-lag-secret"
	svc := haTestService(t, rt, "halag", password, 1, 1)
	ctx := context.Background()

	// As while the standby is being built: not synchronous, and behind.
	st, _ := rt.loadHA(svc.ID)
	base, _ := rt.preparedBase(context.Background(), svc)
	if err := rt.instances.Stop(ctx, rt.haSpec(svc, base, st, 1), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	st.Sync, st.SyncCount = nil, 0
	if err := rt.saveHA(svc.ID, st); err != nil {
		t.Fatal(err)
	}
	pspec := rt.haSpec(svc, base, st, st.Primary)
	if _, err := rt.instances.Reload(ctx, pspec); err != nil {
		t.Fatal(err)
	}
	mustExec(t, svc, password, "INSERT INTO acked SELECT generate_series(1, 100)")

	killInstance(t, rt, pspec)
	if _, err := rt.ensureHA(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if st2, _ := rt.loadHA(svc.ID); st2.Primary != st.Primary {
		t.Errorf("failed over from instance %d to %d, which was not synchronous", st.Primary, st2.Primary)
	}
	c, err := connectTLS(t, svc, password)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM acked").Scan(&n); err != nil || n != 100 {
		t.Errorf("%d of 100 acknowledged rows after the primary's crash (%v)", n, err)
	}
}

// TestRuntime_HARepairsDeadSyncStandby: the repair of a service whose only
// synchronous standby died must not wait on it. Writes on the primary
// (the password, extensions) wait for a synchronous standby, so they must
// come after the standbys are back (or left out of the synchronous set).
// The chaos test found such a repair stuck for good.
func TestRuntime_HARepairsDeadSyncStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several PostgreSQL instances")
	}
	rt := mustRuntime(t, localtest.Base(t))
	const password = "ha-sync-secret"
	svc := newTestService(t, rt, "hasync", password, nil)
	t.Cleanup(func() { rt.stopProxy(context.Background(), svc.ID) }) // before DeleteService
	mustEnsure(t, rt, svc)
	svc.Spec.Replicas, svc.Spec.SyncReplicas = 1, 1
	if _, err := rt.ensureHA(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	st, _ := rt.loadHA(svc.ID)
	base, _ := rt.preparedBase(context.Background(), svc)
	standby := rt.haSpec(svc, base, st, 1)
	pid, ok := rt.instances.Running(standby)
	if !ok {
		t.Fatal("standby not running")
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := rt.instances.Running(standby); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed standby still runs")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	obs, err := rt.ensureHA(ctx, svc)
	if err != nil {
		t.Fatalf("repair after the synchronous standby died: %v", err)
	}
	if !obs.Running || len(obs.Instances) != 2 {
		t.Fatalf("after the repair: running %v, instances %s", obs.Running, roles(obs))
	}
	mustExec(t, svc, password, "CREATE TABLE after_repair (v int)")
}

// TestRuntime_HAPromotesMostAdvanced: with standbys that lag unevenly, a
// failover promotes the one that received the most WAL, and no
// acknowledged commit is lost. Standby 1 (the lower number, which a
// first-come choice would take) is stopped while rows are committed with
// standby 2 as the synchronous one, and is behind when the primary dies.
func TestRuntime_HAPromotesMostAdvanced(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several PostgreSQL instances")
	}
	rt := mustRuntime(t, localtest.Base(t))
	const password = "ha-advanced-pw"
	svc := haTestService(t, rt, "haadv", password, 2, 1)
	ctx := context.Background()
	st, _ := rt.loadHA(svc.ID)
	base, _ := rt.preparedBase(context.Background(), svc)
	if st.Primary != 0 || !slices.Equal(st.Sync, []int{1, 2}) {
		t.Fatalf("HA state %+v: want primary 0 and both standbys synchronous", st)
	}
	lagging := rt.haSpec(svc, base, st, 1)
	if err := rt.instances.Stop(ctx, lagging, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	mustExec(t, svc, password, "INSERT INTO acked SELECT generate_series(1, 500)")
	pspec := rt.haSpec(svc, base, st, st.Primary)
	killInstance(t, rt, pspec)
	if _, err := rt.ensureHA(ctx, svc); err != nil {
		t.Fatal(err)
	}
	st2, _ := rt.loadHA(svc.ID)
	if st2.Primary != 2 {
		t.Errorf("promoted instance %d, want 2, the standby that received the most WAL", st2.Primary)
	}
	c, err := connectTLS(t, svc, password)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM acked").Scan(&n); err != nil || n != 500 {
		t.Errorf("%d of 500 acknowledged rows on the new primary (%v)", n, err)
	}
}
