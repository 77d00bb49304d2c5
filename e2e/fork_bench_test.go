package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkFork_1GiB measures NOW and LAST_SNAPSHOT forks of a parent
// holding about 1 GiB (pgbench -i -s 65), each to READY, beside `cp -a` of
// the parent's data directory on the same disk in the same run: the copy is
// the floor. It runs twice: on the host's filesystem (host) and on a btrfs
// storage image that dbcloud makes and mounts (btrfs-image), where copies
// are clones. -short loads about 30 MB (-s 2) and measures one round, to
// check the benchmark runs, not to measure. Run it once:
//
//	go test ./e2e -run '^$' -bench Fork_1GiB -benchtime 1x -timeout 30m
func BenchmarkFork_1GiB(b *testing.B) {
	pgbench := "/usr/lib/postgresql/15/bin/pgbench"
	if _, err := os.Stat(pgbench); err != nil {
		b.Skip("pgbench not installed")
	}
	// The image is sparse: it takes what the parent, its WAL archive, its
	// snapshots and the cp -a copies write, well under this.
	imageGiB := "16"
	if testing.Short() {
		imageGiB = "2"
	}
	b.Run("host", func(b *testing.B) { benchFork(b, pgbench) })
	b.Run("btrfs-image", func(b *testing.B) { benchFork(b, pgbench, "--storage-image-gib", imageGiB) })
}

func benchFork(b *testing.B, pgbench string, serverArgs ...string) {
	scale, rounds := "65", benchRounds
	if testing.Short() {
		scale, rounds = "2", 1
	}
	s := newServer(b, serverArgs...)
	created := s.create(map[string]any{"name": "bench-parent", "cpu_millis": "2000", "memory_gbs": "8"})
	parent := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	s.waitSnapshot(parent.ServiceID, time.Time{}, 60*time.Second)

	begin := time.Now()
	load := exec.Command(pgbench, "-i", "-s", scale, "-q", "-h", parent.Endpoint.Host,
		"-p", strconv.Itoa(parent.Endpoint.Port), "-U", "tsdbadmin", "tsdb")
	load.Env = append(os.Environ(), "PGPASSWORD="+created.InitialPassword, "PGSSLMODE=require")
	if out, err := load.CombinedOutput(); err != nil {
		b.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	loaded := time.Now()
	pgdata := filepath.Join(s.dir, "runtime", "services", parent.ServiceID, "0", "pgdata")
	b.Logf("pgbench -i -s %s took %v; parent data directory %s (%s)", scale, loaded.Sub(begin).Round(time.Second), du(b, pgdata), filesystemOf(b, pgdata))
	parentMB := float64(duBytes(b, pgdata)) / (1 << 20)
	// The snapshot taken at creation holds no data. Removing it makes the
	// runtime take a fresh one at once, as for a new service; the next is
	// due a day later, so none overlaps the measurements.
	if err := os.RemoveAll(filepath.Join(s.dir, "runtime", "services", parent.ServiceID, "snapshots")); err != nil {
		b.Fatal(err)
	}
	s.waitSnapshot(parent.ServiceID, loaded, 5*time.Minute)
	b.Logf("snapshot after the load: %s", lastSnapshotStats(b, s, parent.ServiceID))

	// The disk of this kind of VM is erratic: the first large copies
	// after a burst of writes run several times slower than later ones. A
	// warm-up copy, then rounds that alternate the copy and the forks, and
	// medians.
	cpA(b, pgdata, false)
	b.ResetTimer()
	var cpNow, cpLast, cpSync, now, last []time.Duration
	for i := 0; i < b.N; i++ {
		for round := 0; round < rounds; round++ {
			// Each fork right after its own cp; which goes first alternates.
			for _, strategy := range [][]string{{"NOW", "LAST_SNAPSHOT"}, {"LAST_SNAPSHOT", "NOW"}}[round%2] {
				cp := cpA(b, pgdata, false)
				took := timeFork(b, s, parent, strategy)
				if strategy == "NOW" {
					cpNow, now = append(cpNow, cp), append(now, took)
				} else {
					cpLast, last = append(cpLast, cp), append(last, took)
				}
			}
			cpSync = append(cpSync, cpA(b, pgdata, true))
		}
	}
	b.StopTimer()
	mNow, mLast, mCpNow, mCpLast, mCpSync := median(now), median(last), median(cpNow), median(cpLast), median(cpSync)
	b.ReportMetric(mNow.Seconds(), "now-s")
	b.ReportMetric(mLast.Seconds(), "last-snapshot-s")
	b.ReportMetric(mCpNow.Seconds(), "cp-s")
	b.ReportMetric(mNow.Seconds()/mCpNow.Seconds(), "now/cp")
	b.ReportMetric(mLast.Seconds()/mCpLast.Seconds(), "last/cp")
	b.ReportMetric(mLast.Seconds()/mNow.Seconds(), "last/now")
	b.ReportMetric(mCpSync.Seconds(), "cp-sync-s")
	b.ReportMetric(parentMB, "parent-MB")
	b.ReportMetric(float64(rounds), "rounds")
	b.Logf("runs: NOW %v beside cp -a %v; LAST_SNAPSHOT %v beside cp -a %v; cp -a + sync %v", now, cpNow, last, cpLast, cpSync)
	b.Logf("medians: NOW fork to READY %v beside cp -a %v (ratio %.2f); LAST_SNAPSHOT fork to READY %v beside cp -a %v (ratio %.2f); cp -a + sync %v (NOW/that %.2f); LAST_SNAPSHOT/NOW %.2f",
		mNow.Round(time.Millisecond), mCpNow.Round(time.Millisecond), mNow.Seconds()/mCpNow.Seconds(),
		mLast.Round(time.Millisecond), mCpLast.Round(time.Millisecond), mLast.Seconds()/mCpLast.Seconds(),
		mCpSync.Round(time.Millisecond), mNow.Seconds()/mCpSync.Seconds(), mLast.Seconds()/mNow.Seconds())
}

// benchRounds is how many times each measurement is repeated for a median.
const benchRounds = 5

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// timeFork forks the parent and waits for READY. It then waits for the
// fork's own first snapshot (taken in the background once it is READY), so
// that copy does not overlap the next measurement, and deletes the fork.
func timeFork(b *testing.B, s *server, parent service, strategy string) time.Duration {
	b.Helper()
	syncDisk(b)
	begin := time.Now()
	var f service
	if code := s.call("POST", s.services()+"/"+parent.ServiceID+"/forkService", map[string]any{"fork_strategy": strategy}, &f); code != 202 {
		b.Fatalf("fork %s: %d %+v", strategy, code, f)
	}
	s.waitStatus(f.ServiceID, "READY", 10*time.Minute)
	took := time.Since(begin)
	b.StopTimer()
	s.waitSnapshot(f.ServiceID, time.Time{}, 5*time.Minute)
	b.Logf("%s fork READY in %v (%s); its own first snapshot: %s", strategy, took.Round(time.Millisecond),
		serverLogPhases(b, s, f.ServiceID), lastSnapshotStats(b, s, f.ServiceID))
	s.call("DELETE", s.services()+"/"+f.ServiceID, nil, nil)
	s.waitGone(f.ServiceID, time.Minute)
	settle(b)
	b.StartTimer()
	return took
}

// cpA times `cp -a` of the data directory into the same data directory
// tree (same disk), optionally followed by sync, and removes the copy.
func cpA(b *testing.B, pgdata string, andSync bool) time.Duration {
	b.Helper()
	dst := filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(pgdata))), fmt.Sprintf("bench-cp-%d", time.Now().UnixNano()))
	syncDisk(b)
	begin := time.Now()
	if out, err := exec.Command("cp", "-a", pgdata, dst).CombinedOutput(); err != nil {
		// A live data directory changes under cp; files that vanish are
		// the only expected complaint.
		if !strings.Contains(string(out), "No such file") {
			b.Fatalf("cp -a: %v: %s", err, out)
		}
	}
	if andSync {
		syncDisk(b)
	}
	took := time.Since(begin)
	b.StopTimer()
	os.RemoveAll(dst)
	settle(b)
	b.StartTimer()
	return took
}

// settle flushes and lets the disk finish what a large delete started
// (the root filesystem discards freed blocks), so the next measurement
// does not pay for the previous one.
func settle(b *testing.B) {
	syncDisk(b)
	time.Sleep(3 * time.Second)
}

func syncDisk(b *testing.B) {
	b.Helper()
	if err := exec.Command("sync").Run(); err != nil {
		b.Fatal(err)
	}
}

func du(b *testing.B, dir string) string {
	out, err := exec.Command("du", "-sh", dir).Output()
	if err != nil {
		b.Fatal(err)
	}
	return strings.Fields(string(out))[0]
}

// duBytes is the disk usage of dir in bytes.
func duBytes(b *testing.B, dir string) int64 {
	out, err := exec.Command("du", "-sb", dir).Output()
	if err != nil {
		b.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

func filesystemOf(b *testing.B, dir string) string {
	out, err := exec.Command("df", "--output=fstype", dir).Output()
	if err != nil {
		b.Fatal(err)
	}
	lines := strings.Fields(string(out))
	return lines[len(lines)-1]
}

func lastSnapshotStats(b *testing.B, s *server, id string) string {
	manifests, _ := filepath.Glob(filepath.Join(s.dir, "runtime", "services", id, "snapshots", "*", "manifest.json"))
	if len(manifests) == 0 {
		return "none"
	}
	raw, err := os.ReadFile(manifests[len(manifests)-1])
	if err != nil {
		b.Fatal(err)
	}
	var m struct {
		Files      int64 `json:"files"`
		Bytes      int64 `json:"bytes"`
		Reflinked  bool  `json:"reflinked"`
		DurationMS int64 `json:"duration_ms"`
	}
	json.Unmarshal(raw, &m)
	return fmt.Sprintf("%d files, %d MiB, reflink %v, %d ms", m.Files, m.Bytes>>20, m.Reflinked, m.DurationMS)
}

// serverLogPhases picks the fork's phases out of the server's log: the
// copy, the recovery start, the restore in all, and the reconcile.
func serverLogPhases(b *testing.B, s *server, id string) string {
	raw, err := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if err != nil {
		return ""
	}
	var phases []string
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, id) {
			continue
		}
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		if e["msg"] == "request" {
			continue
		}
		for _, k := range []string{"ms", "copy_ms", "duration_ms"} {
			if v, ok := e[k]; ok {
				phases = append(phases, fmt.Sprintf("%s %s=%v", e["msg"], k, v))
			}
		}
	}
	return strings.Join(phases, "; ")
}
