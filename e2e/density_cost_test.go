package e2e

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostCost is what a step of BenchmarkDensity holds on the host, beside
// its services' own memory and CPU.
type hostCost struct {
	services int
	// The control plane process: resident memory, goroutines (from its
	// Prometheus page), open files and its limit of them.
	rssKB      int64
	goroutines int
	fds        int
	fdLimit    string
	// listeners are the TCP listeners on the endpoint port range; procs
	// the processes working in the runtime directory (postmasters and
	// their children, poolers, proxies).
	listeners int
	procs     int
	// disk is what the runtime directory takes of the host's disk: the
	// btrfs image's allocated blocks, or du of the directory on ext4.
	disk int64
}

func (c hostCost) String() string {
	return fmt.Sprintf("control plane RSS %d MiB, %d goroutines, %d open files (limit %s); %d listeners on the endpoint ports; %d processes in the runtime directory; %d MiB of disk",
		c.rssKB>>10, c.goroutines, c.fds, c.fdLimit, c.listeners, c.procs, c.disk>>20)
}

// hostCost measures the step's hostCost; lo and hi are the endpoint port
// range.
func (d *density) hostCost(b *testing.B, lo, hi int) hostCost {
	b.Helper()
	pid := d.s.cmd.Process.Pid
	c := hostCost{services: len(d.ids), listeners: listeners(lo, hi)}
	c.rssKB, c.fdLimit = procStatus(pid)
	if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		c.fds = len(fds)
	}
	for _, l := range strings.Split(string(fetch(d.metrics)), "\n") {
		if v, ok := strings.CutPrefix(l, "go_goroutines "); ok {
			c.goroutines, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	dir := d.s.runtimeDir()
	c.procs = processesUnder(dir)
	if d.fs == "btrfs" {
		var st syscall.Stat_t
		if err := syscall.Stat(dir+".img", &st); err != nil {
			b.Fatalf("the storage image: %v", err)
		}
		c.disk = st.Blocks * 512
	} else {
		out, err := exec.Command("du", "-s", "-B1", dir).Output()
		if err != nil {
			b.Fatalf("du %s: %v", dir, err)
		}
		c.disk, _ = strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	}
	return c
}

// reportPerService reports what each service added from one step to the
// next cost: the time to make (and park) it, its disk, and the control
// plane's memory, goroutines and open files.
func (d *density) reportPerService(b *testing.B, from, to hostCost, made time.Duration) {
	n := float64(to.services - from.services)
	b.ReportMetric(made.Seconds()/n, "make-s/service")
	b.ReportMetric(float64(to.disk-from.disk)/n/(1<<20), "disk-MB/service")
	b.ReportMetric(float64(to.rssKB-from.rssKB)/n, "plane-KB/service")
	b.ReportMetric(float64(to.goroutines-from.goroutines)/n, "goroutines/service")
	b.ReportMetric(float64(to.fds-from.fds)/n, "fds/service")
	b.ReportMetric(float64(to.listeners-from.listeners)/n, "listeners/service")
	b.ReportMetric(float64(to.procs-from.procs)/n, "procs/service")
	b.Logf("per service added from %d to %d (%s): made and parked in %.2f s, %.1f MiB of disk, %.1f KiB of control plane RSS, %.2f goroutines, %.2f open files, %.2f listeners, %.2f processes",
		from.services, to.services, d.fs, made.Seconds()/n, float64(to.disk-from.disk)/n/(1<<20), float64(to.rssKB-from.rssKB)/n,
		float64(to.goroutines-from.goroutines)/n, float64(to.fds-from.fds)/n, float64(to.listeners-from.listeners)/n, float64(to.procs-from.procs)/n)
}

// connectAll connects to every READY service and runs a query; with
// auto-pause, to a sample of the parked ones too, each woken by the
// connection. Failures are errors of the run.
func (d *density) connectAll(b *testing.B) (ready, woken int) {
	b.Helper()
	try := func(id string) bool {
		if err := d.selectOne(id); err != nil {
			b.Error(err)
			return false
		}
		return true
	}
	for _, id := range d.readyIDs() {
		if try(id) {
			ready++
		}
	}
	if d.park != "autopause" || len(d.ids) <= d.ready {
		return ready, 0
	}
	parked := d.ids[d.ready:]
	for _, i := range rand.New(rand.NewPCG(33, 2000)).Perm(len(parked))[:min(50, len(parked))] {
		if try(parked[i]) {
			woken++
		}
	}
	return ready, woken
}

// selectOne connects to service id as its owner would (TLS, SCRAM, waking
// it if it is paused) and runs SELECT 1.
func (d *density) selectOne(id string) error {
	var svc service
	if code := d.s.call("GET", d.s.services()+"/"+id, nil, &svc); code != 200 {
		return fmt.Errorf("get %s: %d", id, code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := d.s.connect(ctx, svc, d.passwords[id])
	if err == nil {
		defer c.Close(ctx)
		var one int
		err = c.QueryRow(ctx, "SELECT 1").Scan(&one)
	}
	if err != nil {
		return fmt.Errorf("connect to %s (%s): %v", id, svc.Status, err)
	}
	return nil
}

// listeners counts the TCP sockets listening on a port in [lo, hi].
func listeners(lo, hi int) int {
	n := 0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fl := strings.Fields(sc.Text())
			if len(fl) < 4 || fl[3] != "0A" { // LISTEN
				continue
			}
			_, portHex, _ := strings.Cut(fl[1], ":")
			if p, err := strconv.ParseInt(portHex, 16, 32); err == nil && int(p) >= lo && int(p) <= hi {
				n++
			}
		}
		f.Close()
	}
	return n
}

// processesUnder counts the processes whose working directory is dir or
// below it.
func processesUnder(dir string) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
			n++
		}
	}
	return n
}

// procStatus is a process's resident memory in KiB and its open files
// limit (soft).
func procStatus(pid int) (rssKB int64, fdLimit string) {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			rssKB, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	raw, _ = os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "Max open files") {
			fdLimit = strings.Fields(l)[3]
		}
	}
	return rssKB, fdLimit
}

// diskOf says where one service's disk goes: each directory of its
// service directory, and the WAL in its instances' data directories, with
// the bytes their files hold and, on btrfs, the part no other file shares
// (btrfs filesystem du: a clone shares its blocks with what it was cloned
// from until either is written).
func (d *density) diskOf(b *testing.B, id string) string {
	b.Helper()
	dir := filepath.Join(d.s.runtimeDir(), "services", id)
	paths, _ := filepath.Glob(filepath.Join(dir, "*"))
	wal, _ := filepath.Glob(filepath.Join(dir, "*", "pgdata", "pg_wal"))
	paths = append(paths, wal...)
	if len(paths) == 0 {
		return "no files"
	}
	var parts []string
	if d.fs == "btrfs" {
		out, err := exec.Command("btrfs", append([]string{"filesystem", "du", "-s", "--raw"}, paths...)...).Output()
		if err != nil {
			b.Fatalf("btrfs filesystem du %s: %v", dir, err)
		}
		// Total, Exclusive, Set shared, Filename, under a heading line.
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
			f := strings.Fields(l)
			if len(f) < 4 {
				continue
			}
			total, _ := strconv.ParseInt(f[0], 10, 64)
			excl, _ := strconv.ParseInt(f[1], 10, 64)
			rel, _ := filepath.Rel(dir, f[3])
			parts = append(parts, fmt.Sprintf("%s %.1f MiB (%.1f its own)", rel, float64(total)/(1<<20), float64(excl)/(1<<20)))
		}
		return strings.Join(parts, ", ")
	}
	out, err := exec.Command("du", append([]string{"-s", "-B1"}, paths...)...).Output()
	if err != nil {
		b.Fatalf("du %s: %v", dir, err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		rel, _ := filepath.Rel(dir, f[1])
		parts = append(parts, fmt.Sprintf("%s %.1f MiB", rel, float64(n)/(1<<20)))
	}
	return strings.Join(parts, ", ")
}
