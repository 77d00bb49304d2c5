package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"dbcloud/internal/loadgen"
	"dbcloud/internal/testports"
)

// pprofDirEnv names a directory: BenchmarkDensity then runs the server
// with --pprof and keeps a CPU profile of each idle window there
// (density-N.pprof, N services), and the load runs one of the server under
// load (load.pprof, load-open.pprof).
const pprofDirEnv = "DBCLOUD_BENCH_PPROF"

// BenchmarkDensity's knobs (issue 33: 2,000 services on one host, 50 READY
// and idle, the others paused).
const (
	// densityServicesEnv is the services of the last step (2000 unless set).
	densityServicesEnv = "DBCLOUD_DENSITY_SERVICES"
	// densityReadyEnv is how many of them stay READY (50 unless set); the
	// others are parked as soon as they are READY, a batch at a time, so
	// that the running ones never outgrow the host.
	densityReadyEnv = "DBCLOUD_DENSITY_READY"
	// densityParkEnv is how a service is parked: "stop" (the default) or
	// "autopause" (setAutoPause, then paused by the engine once idle).
	densityParkEnv = "DBCLOUD_DENSITY_PARK"
	// densityFSEnv is "btrfs" (the default: serve's own copy-on-write
	// image, where a new cluster is a clone) or "ext4" (no image: the
	// runtime directory's own filesystem, each cluster a copy).
	densityFSEnv = "DBCLOUD_DENSITY_FS"
	// densityForEnv bounds the making of services (a duration such as
	// 30m): past it no batch is started, and the last step is measured at
	// the services made, so that a run on a slow host still ends, cleaned
	// up, when its owner needs it to.
	densityForEnv = "DBCLOUD_DENSITY_FOR"
)

// densityBatch is how many services are made at a time before the batch
// is parked.
const densityBatch = 40

// BenchmarkDensity runs many shared services on the real binary, most of
// them parked (stopped, or auto-paused: DBCLOUD_DENSITY_PARK) and 50 READY
// and idle, and reports, at 10 and then at all of them (2,000 unless
// DBCLOUD_DENSITY_SERVICES says; 2 and 4 with -short): the API's latency
// (GET service, list services), the control plane's own CPU while
// everything is idle (utime+stime of its process over a window, as a
// fraction of one core) and the host's, each READY service's memory
// (median cgroup working set from its metrics; MemAvailable drop per
// service added), and per service added: the time to make and park it,
// its disk (the btrfs image's allocated blocks, or du of the runtime
// directory on ext4: DBCLOUD_DENSITY_FS), the control plane's resident
// memory, goroutines and open files, and the listeners and processes left
// for it, also at 200 on the way to a top above it. Every READY service is
// connected to; with auto-pause a sample of the paused ones too (each by
// waking it).
//
// A stopped service costs what a paused one does: no postmaster, no
// process of its own, no metrics; until auto-pause exists the run parks
// services with stop.
//
//	DBCLOUD_DENSITY_SERVICES=500 go test -run '^$' -bench '^BenchmarkDensity$' -benchtime 1x -timeout 120m ./e2e/
func BenchmarkDensity(b *testing.B) {
	top, ready := envInt(b, densityServicesEnv, 2000), envInt(b, densityReadyEnv, 50)
	steps, idle, apiRound := []int{10, top}, 30*time.Second, 3*time.Second
	if top > 200 {
		// The earlier figures were at 200: the same build's, in
		// the same run, beside the top.
		steps = []int{10, 200, top}
	}
	if testing.Short() {
		top, ready = 4, 2
		steps, idle, apiRound = []int{2, 4}, 5*time.Second, 500*time.Millisecond
	}
	park := os.Getenv(densityParkEnv)
	if park == "" {
		park = "stop"
	}
	if park != "stop" && park != "autopause" {
		b.Fatalf("%s=%q: want stop or autopause", densityParkEnv, park)
	}
	lo, hi := portSpan(b, top+50)
	// The host's capacity flags are the defaults: shared services are
	// admitted by their footprint (issue 38). The project quotas are
	// lifted only because the benchmark keeps its services in one project.
	metricsAddr := "127.0.0.1:" + strconv.Itoa(testports.MustPort(b))
	args := []string{"--port-min", strconv.Itoa(lo), "--port-max", strconv.Itoa(hi),
		"--quota-services", strconv.Itoa(top + 10), "--pool-size", "4", "--metrics-listen", metricsAddr,
		"--quota-instances", "0", "--quota-cpu-millis", "0", "--quota-memory-gbs", "0", "--quota-storage-gbs", "0"}
	fs := os.Getenv(densityFSEnv)
	switch fs {
	case "", "btrfs":
		fs = "btrfs"
	case "ext4":
		args = append(args, "--storage-image-gib", "0")
	default:
		b.Fatalf("%s=%q: want btrfs or ext4", densityFSEnv, fs)
	}
	pprofDir := os.Getenv(pprofDirEnv)
	var pprofURL string
	if pprofDir != "" {
		args = append(args, "--pprof")
		pprofURL = "http://" + metricsAddr + "/debug/pprof/profile"
	}
	var until time.Time
	if v := os.Getenv(densityForEnv); v != "" {
		f, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("%s=%q: %v", densityForEnv, v, err)
		}
		until = time.Now().Add(f)
	}
	for b.Loop() {
		s := newServer(b, args...)
		d := &density{s: s, client: apiClient(b, s), ready: ready, park: park, fs: fs, metrics: "http://" + metricsAddr + "/metrics",
			passwords: map[string]string{}, until: until}
		b.Cleanup(func() { d.teardown(b) })
		before := memAvailable()
		var availAt []int64
		var costs []hostCost
		for _, n := range steps {
			began := time.Now()
			d.grow(b, n)
			made := time.Since(began)
			if len(d.ids) < n {
				b.Logf("%s passed: %d services made of %d", densityForEnv, len(d.ids), n)
				n = len(d.ids)
			}
			b.Logf("%d services (%d READY), %v after the first create of this step (%d creates answered 503 so far, retried)", n, min(n, ready), made.Round(time.Second), d.create503)
			d.quiet(b)
			var prof chan []byte
			if pprofURL != "" {
				prof = make(chan []byte, 1)
				go func() { prof <- fetch(pprofURL + "?seconds=" + strconv.Itoa(int(idle.Seconds()))) }()
			}
			cpu, host := d.idleCPU(b, idle)
			if prof != nil {
				if err := os.WriteFile(filepath.Join(pprofDir, fmt.Sprintf("density-%d.pprof", n)), <-prof, 0o644); err != nil {
					b.Error(err)
				}
			}
			get, list := d.apiLatency(b, apiRound)
			mem := d.medianMemory(b)
			availAt = append(availAt, memAvailable())
			cost := d.hostCost(b, lo, hi)
			costs = append(costs, cost)
			connected, woken := d.connectAll(b)
			detect, repair := d.repairTime(b)
			p := fmt.Sprintf("s%d-", n)
			b.ReportMetric(cpu, p+"cpu-cores")
			b.ReportMetric(host, p+"host-cpu-cores")
			b.ReportMetric(loadgen.Ms(get.P50), p+"get-p50-ms")
			b.ReportMetric(loadgen.Ms(get.P99), p+"get-p99-ms")
			b.ReportMetric(float64(get.Count)/(3*apiRound.Seconds()), p+"get-req/s")
			b.ReportMetric(loadgen.Ms(list.P50), p+"list-p50-ms")
			b.ReportMetric(loadgen.Ms(list.P99), p+"list-p99-ms")
			b.ReportMetric(float64(list.Count)/(3*apiRound.Seconds()), p+"list-req/s")
			b.ReportMetric(mem, p+"median-MB/service")
			b.ReportMetric(detect.Seconds(), p+"detect-s")
			b.ReportMetric(repair.Seconds(), p+"repair-s")
			b.ReportMetric(float64(before-availAt[len(availAt)-1])/float64(n)/(1<<20), p+"host-MB/service")
			line := fmt.Sprintf("%d services (%d READY, the others parked by %s, on %s): control plane idle CPU %.4f cores (the host's %.3f); GET p50 %.2f ms p99 %.2f ms; list p50 %.2f ms p99 %.2f ms; median %0.f MB per READY service; MemAvailable %d MiB lower than at the start; %s; %d READY connected, %d parked woken; a killed postmaster seen %v and READY again %v after the kill",
				n, min(n, ready), park, fs, cpu, host, loadgen.Ms(get.P50), loadgen.Ms(get.P99), loadgen.Ms(list.P50), loadgen.Ms(list.P99), mem, (before-availAt[len(availAt)-1])>>20,
				cost, connected, woken, detect.Round(time.Millisecond), repair.Round(time.Millisecond))
			b.Log(line)
			b.Logf("disk of the first service (READY): %s", d.diskOf(b, d.ids[0]))
			if len(d.ids) > d.ready {
				b.Logf("disk of the last service (parked): %s", d.diskOf(b, d.ids[len(d.ids)-1]))
			}
			if pprofDir != "" {
				// Also at once: the report comes only after the cleanup
				// of hundreds of services, minutes later.
				os.WriteFile(filepath.Join(pprofDir, fmt.Sprintf("density-%d.txt", n)), []byte(line+"\n"), 0o644)
			}
			if len(costs) > 1 {
				d.reportPerService(b, costs[len(costs)-2], cost, made)
			}
		}
		// The services added in the last step, over the MemAvailable they
		// took: free of what the server and its pool hold anyway.
		added := len(d.ids) - steps[len(steps)-2]
		b.ReportMetric(float64(availAt[len(availAt)-2]-availAt[len(availAt)-1])/float64(added)/(1<<20), "added-host-MB/service")
		b.ReportMetric(float64(d.create503), "create-503s")
		b.ReportMetric(float64(len(d.ids)), "services")
		b.ReportMetric(0, "ns/op")
	}
}

// envInt reads a positive count from the environment, def when unset.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive count", name, v)
	}
	return n
}

// density is one run's server and the services it made.
type density struct {
	s       *server
	client  *http.Client
	metrics string // the server's Prometheus page
	// ready is how many services stay READY (the first made); park how
	// the others are parked; fs the filesystem of the runtime directory.
	ready     int
	park      string
	fs        string
	ids       []string
	passwords map[string]string
	// create503 counts creates answered 503 (and retried).
	create503 int
	// until, if set, is when grow stops starting batches.
	until time.Time
}

// grow makes services until there are n, densityBatch at a time: each
// batch is created eight POSTs at a time (each answered 202 at once; the
// engine does the work) and waited for until READY, and those past the
// first d.ready are then parked. Parking overlaps the next batch: the
// previous batch must show parked only before this one is parked, so that
// auto-pause's idle wait runs while the next batch is made, and at most
// two batches besides the READY ones are running at any time.
func (d *density) grow(b *testing.B, n int) {
	b.Helper()
	var parking []string
	for len(d.ids) < n && (d.until.IsZero() || time.Now().Before(d.until)) {
		first := len(d.ids)
		d.create(b, min(n, first+densityBatch))
		batch := d.ids[first:]
		d.waitReady(b, batch)
		d.waitParked(b, parking)
		parking = nil
		for i, id := range batch {
			if first+i >= d.ready {
				parking = append(parking, id)
			}
		}
		d.askPark(b, parking)
	}
	d.waitParked(b, parking)
}

// create makes services until there are n.
func (d *density) create(b *testing.B, n int) {
	b.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				var created service
				code, err := d.s.do("POST", d.s.services(), map[string]any{"name": "dense-" + strconv.Itoa(i), "cpu_millis": "shared"}, &created)
				// A 503 made nothing and says to try again (concurrent
				// creates can take every port one probed); counted and
				// retried as a client would. A 500 is a failure.
				for try := 0; err == nil && code == 503 && try < 5; try++ {
					mu.Lock()
					d.create503++
					mu.Unlock()
					code, err = d.s.do("POST", d.s.services(), map[string]any{"name": "dense-" + strconv.Itoa(i), "cpu_millis": "shared"}, &created)
				}
				if err != nil || code != 202 {
					b.Errorf("create %d: %d %v %s", i, code, err, created.Message)
					continue
				}
				mu.Lock()
				d.ids = append(d.ids, created.ServiceID)
				d.passwords[created.ServiceID] = created.InitialPassword
				mu.Unlock()
			}
		})
	}
	for i := len(d.ids); i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// waitReady waits until every one of ids is READY and has its first
// metrics.
func (d *density) waitReady(b *testing.B, ids []string) {
	b.Helper()
	// A minute each: on a host shared with other work an instance's first
	// start has taken 36 s.
	d.waitFor(b, ids, time.Duration(len(ids))*time.Minute, func(svc service) bool {
		return svc.Status == "READY" && svc.Metrics != nil && svc.Metrics.MemoryMB > 0
	})
}

// waitFor polls the list of services until every one of ids satisfies ok.
func (d *density) waitFor(b *testing.B, ids []string, within time.Duration, ok func(service) bool) {
	b.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	deadline := time.Now().Add(within)
	for {
		var list []service
		if code := d.s.call("GET", d.s.services(), nil, &list); code != 200 {
			b.Fatalf("list services: %d", code)
		}
		done := 0
		statuses := map[string]int{}
		for _, svc := range list {
			if want[svc.ServiceID] {
				statuses[svc.Status]++
				if ok(svc) {
					done++
				}
			}
		}
		if done == len(want) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d services as wanted after %v: %v", done, len(want), within, statuses)
		}
		time.Sleep(time.Second)
	}
}

// densityIdleSeconds is the idle_seconds the autopause parking asks for.
const densityIdleSeconds = 60

// askPark asks for services to be parked: stopped, or with auto-pause
// (setAutoPause {"idle_seconds": 60}) left idle for the engine to pause.
func (d *density) askPark(b *testing.B, ids []string) {
	b.Helper()
	for _, id := range ids {
		path, body := d.s.services()+"/"+id+"/stop", any(nil)
		if d.park == "autopause" {
			path, body = d.s.services()+"/"+id+"/setAutoPause", map[string]int{"idle_seconds": densityIdleSeconds}
		}
		var out service
		if code, err := d.s.do("POST", path, body, &out); err != nil || code >= 300 {
			b.Fatalf("park %s (%s): %d %v %s", id, d.park, code, err, out.Message)
		}
	}
}

// waitParked waits until each of ids shows PAUSED (a stopped service
// shows it too).
func (d *density) waitParked(b *testing.B, ids []string) {
	b.Helper()
	if len(ids) == 0 {
		return
	}
	within := time.Duration(len(ids)) * 5 * time.Second
	if d.park == "autopause" {
		within += 3 * densityIdleSeconds * time.Second
	}
	d.waitFor(b, ids, within, func(svc service) bool { return svc.Status == "PAUSED" })
}

// readyIDs are the services left READY.
func (d *density) readyIDs() []string { return d.ids[:min(d.ready, len(d.ids))] }

// teardown deletes every service the run made, eight at a time, and waits
// until the list is empty: the server's own cleanup gives a whole project
// 30 seconds, less than hundreds of deletes take, and each service has an
// OS user of its own that only its delete removes. With auto-pause, each
// parked service is first connected to (woken) and queried: every one of
// them must be connectable, and waking them one by one just before their
// deletes keeps no more than eight awake at once, where waking all would
// need thousands of running servers' memory.
func (d *density) teardown(b *testing.B) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var woken, failed int
	next := make(chan string)
	for range 8 {
		wg.Go(func() {
			for id := range next {
				if d.park == "autopause" && !slices.Contains(d.readyIDs(), id) {
					err := d.selectOne(id)
					mu.Lock()
					if err != nil {
						failed++
						b.Error(err)
					} else {
						woken++
					}
					mu.Unlock()
				}
				d.s.do("POST", d.s.services()+"/"+id+"/setEnvironment", map[string]string{"environment": "DEV"}, nil)
				d.s.do("DELETE", d.s.services()+"/"+id, nil, nil)
			}
		})
	}
	for _, id := range d.ids {
		next <- id
	}
	close(next)
	wg.Wait()
	if d.park == "autopause" {
		b.Logf("teardown: %d parked services woken and queried (SELECT 1) before their deletes, %d failed", woken, failed)
	}
	deadline := time.Now().Add(time.Duration(len(d.ids))*10*time.Second + 2*time.Minute)
	for time.Now().Before(deadline) {
		var list []service
		if code, err := d.s.do("GET", d.s.services(), nil, &list); err != nil || code != 200 || len(list) == 0 {
			return
		}
		time.Sleep(2 * time.Second)
	}
	b.Errorf("services still listed %v after their deletes", time.Until(deadline))
}

// quiet waits until every READY service has its first snapshot (each new
// service takes one at once), so the idle window measures an idle
// server, not the backups of the services just made.
func (d *density) quiet(b *testing.B) {
	b.Helper()
	deadline := time.Now().Add(time.Duration(len(d.readyIDs())) * 10 * time.Second)
	pending := slices.Clone(d.readyIDs())
	for len(pending) > 0 {
		var left []string
		for _, id := range pending {
			var snaps struct{ Snapshots []struct{} }
			if code := d.s.call("GET", d.s.services()+"/"+id+"/snapshots", nil, &snaps); code != 200 || len(snaps.Snapshots) == 0 {
				left = append(left, id)
			}
		}
		pending = left
		if len(pending) > 0 {
			if time.Now().After(deadline) {
				b.Fatalf("%d services have no snapshot yet", len(pending))
			}
			time.Sleep(2 * time.Second)
		}
	}
	time.Sleep(6 * time.Second) // the last snapshot's WAL archiving and metrics round
}

// idleCPU is the control plane's CPU time (user and system) over window,
// and the whole host's, each as a fraction of one core: the host's is
// what the idle services themselves cost too (their postmasters' and
// background workers' wakeups), which requests to the API compete with.
func (d *density) idleCPU(b *testing.B, window time.Duration) (plane, host float64) {
	b.Helper()
	pid := d.s.cmd.Process.Pid
	t0, h0, start := procCPU(b, pid), hostCPU(b), time.Now()
	time.Sleep(window)
	took := time.Since(start).Seconds()
	return (procCPU(b, pid) - t0).Seconds() / took, (hostCPU(b) - h0).Seconds() / took
}

// hostCPU is the time all CPUs spent busy (neither idle nor waiting for
// I/O) since boot, from /proc/stat.
func hostCPU(b *testing.B) time.Duration {
	b.Helper()
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	// cpu user nice system idle iowait irq softirq steal ..., in ticks.
	var busy int64
	for i, f := range strings.Fields(line)[1:] {
		if n, err := strconv.ParseInt(f, 10, 64); err == nil && i != 3 && i != 4 && i < 8 {
			busy += n
		}
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

// procCPU is the utime+stime of a process, from /proc/PID/stat.
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command (which may hold spaces) in parentheses:
	// utime and stime are fields 14 and 15, in clock ticks of 1/100 s.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// apiLatency runs 4 clients in a closed loop against GET service (a
// random one of all) and then list services, alternating over 3 rounds
// of round each.
func (d *density) apiLatency(b *testing.B, round time.Duration) (get, list loadgen.Stats) {
	b.Helper()
	rec := loadgen.NewRecorder()
	rnd := make([]*rand.Rand, 4)
	for i := range rnd {
		rnd[i] = rand.New(rand.NewPCG(uint64(i), 19))
	}
	send := func(ctx context.Context, kind, path string) {
		req, _ := http.NewRequest("GET", d.s.baseURL+path, nil)
		req.SetBasicAuth(d.s.boot.AccessKey, d.s.boot.SecretKey)
		loadgen.Do(ctx, rec, d.client, kind, req)
	}
	for range 3 {
		loadgen.Run(context.Background(), 4, round, func(ctx context.Context, i int) {
			send(ctx, "get", d.s.services()+"/"+d.ids[rnd[i].IntN(len(d.ids))])
		})
		loadgen.Run(context.Background(), 4, round, func(ctx context.Context, i int) {
			send(ctx, "list", d.s.services())
		})
	}
	for _, st := range rec.Stats() {
		if st.Count5xx() > 0 || st.Errors > 0 || st.Status[200] != st.Count {
			b.Errorf("%s: statuses %v, %d without an answer (%s)", st.Kind, st.Status, st.Errors, st.LastError)
		}
		switch st.Kind {
		case "get":
			get = st
		case "list":
			list = st
		}
	}
	return get, list
}

// repairTime kills the postmaster of the newest READY service (SIGKILL) and
// returns how long the health loop took to see it (its "service
// unhealthy" line) and to have it READY again: how promptly repairs come
// with this many services to check.
func (d *density) repairTime(b *testing.B) (detect, repair time.Duration) {
	b.Helper()
	id := d.readyIDs()[len(d.readyIDs())-1]
	pids := d.s.postmasters(id)
	if len(pids) != 1 {
		b.Fatalf("postmasters of %s: %v", id, pids)
	}
	killed, offset := time.Now(), d.s.logOffset()
	syscall.Kill(pids[0], syscall.SIGKILL)
	d.s.waitUnhealthy(id, offset, 2*time.Minute)
	detect = time.Since(killed)
	d.s.waitStatus(id, "READY", 2*time.Minute)
	return detect, time.Since(killed)
}

// medianMemory is the median memory of the READY services as their
// metrics show it (the cgroup's working set), in MB.
func (d *density) medianMemory(b *testing.B) float64 {
	b.Helper()
	var list []service
	if code := d.s.call("GET", d.s.services(), nil, &list); code != 200 {
		b.Fatalf("list services: %d", code)
	}
	var mems []float64
	for _, svc := range list {
		if svc.Metrics != nil && svc.Status == "READY" {
			mems = append(mems, float64(svc.Metrics.MemoryMB))
		}
	}
	if len(mems) == 0 {
		b.Fatal("no metrics")
	}
	slices.Sort(mems)
	return mems[len(mems)/2]
}

// apiClient is a keep-alive HTTPS client trusting the server's CA.
func apiClient(b *testing.B, s *server) *http.Client {
	pem, err := os.ReadFile(s.boot.CAFile)
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return loadgen.NewClient(&tls.Config{RootCAs: pool}, 8)
}

// fetch GETs url and returns the body (nil on any error).
func fetch(url string) []byte {
	res, err := http.Get(url)
	if err != nil {
		return nil
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return raw
}

// portSpan claims consecutive port blocks for at least n endpoint ports
// (a server's range holds one block; hundreds of services need several),
// and gives back those it claimed on the way that were not consecutive.
func portSpan(b testing.TB, n int) (int, int) {
	b.Helper()
	need := (n + testports.BlockSize - 1) / testports.BlockSize
	var run, stray []int
	for len(run) < need {
		p, err := testports.Block()
		if err != nil {
			b.Fatal(err)
		}
		if len(run) > 0 && p != run[len(run)-1]+testports.BlockSize {
			stray = append(stray, run...)
			run = nil
		}
		run = append(run, p)
	}
	for _, p := range stray {
		testports.Release(p)
	}
	b.Cleanup(func() {
		for _, p := range run {
			testports.Release(p)
		}
	})
	return run[0], run[len(run)-1] + testports.BlockSize - 1
}
