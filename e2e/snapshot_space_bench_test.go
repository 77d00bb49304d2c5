package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkSnapshotSpace measures what a week of daily snapshots costs on
// disk: a parent loaded by pgbench -i -s 65 (about 1 GiB), then seven
// rounds of a change to 5% of its rows (a contiguous range, as a day's
// new and updated data) each followed by a snapshot. The disk space the
// seven snapshots take is the filesystem's used space with them minus
// without them, on a filesystem of the benchmark's own (so no other writer
// counts): ext4, where a snapshot is a full copy, and btrfs, where it is a
// clone that costs only what changed after it. Reported as (data +
// snapshots) / data, the data being the data directory without its WAL,
// which snapshots leave out. -short loads -s 2 and takes two snapshots, to
// check the benchmark runs.
//
//	go test ./e2e -run '^$' -bench SnapshotSpace -benchtime 1x -timeout 60m
func BenchmarkSnapshotSpace(b *testing.B) {
	pgbench := "/usr/lib/postgresql/15/bin/pgbench"
	if _, err := os.Stat(pgbench); err != nil {
		b.Skip("pgbench not installed")
	}
	for _, fstype := range []string{"ext4", "btrfs"} {
		b.Run(fstype, func(b *testing.B) {
			// Sparse: eight copies of the parent on ext4, well under this.
			benchSnapshotSpace(b, pgbench, mountImage(b, fstype, "24G"))
		})
	}
}

func benchSnapshotSpace(b *testing.B, pgbench, dir string) {
	scale, days := 65, 7
	if testing.Short() {
		scale, days = 2, 2
	}
	// On the filesystem under test, not on a storage image made on it.
	s := newServerIn(b, dir, "--pool-size", "1", "--snapshot-interval", "2s", "--snapshot-retention", "24h", "--storage-image-gib", "0")
	created := s.create(map[string]any{"name": "week", "cpu_millis": "2000", "memory_gbs": "8"})
	svc := s.waitStatus(created.ServiceID, "READY", 90*time.Second)
	load := exec.Command(pgbench, "-i", "-s", strconv.Itoa(scale), "-q", "-h", svc.Endpoint.Host,
		"-p", strconv.Itoa(svc.Endpoint.Port), "-U", "tsdbadmin", "tsdb")
	load.Env = append(os.Environ(), "PGPASSWORD="+created.InitialPassword, "PGSSLMODE=require")
	if out, err := load.CombinedOutput(); err != nil {
		b.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	ctx := context.Background()
	conn := s.mustConnect(svc, created.InitialPassword)
	defer conn.Close(ctx)
	snapshots := filepath.Join(s.dir, "runtime", "services", svc.ServiceID, "snapshots")
	rows := scale * 100000 // pgbench_accounts rows per scale unit
	b.ResetTimer()
	var kept []string
	for day := range days {
		lo, hi := day*rows/20+1, (day+1)*rows/20
		if _, err := conn.Exec(ctx, "UPDATE pgbench_accounts SET abalance = abalance + 1, filler = md5(aid::text) WHERE aid BETWEEN $1 AND $2", lo, hi); err != nil {
			b.Fatal(err)
		}
		changed := time.Now()
		kept = append(kept, snapshotAfter(b, snapshots, changed, 10*time.Minute))
		// The 2 s schedule takes more snapshots than one a day: keep the
		// one after each day's change, as a daily schedule would have.
		pruneSnapshotsExcept(b, snapshots, kept)
	}
	b.StopTimer()
	// The schedule goes on: stop it before measuring.
	s.stop()
	pruneSnapshotsExcept(b, snapshots, kept)
	// The data a snapshot copies: the data directory without its WAL.
	pgdata := filepath.Join(s.dir, "runtime", "services", svc.ServiceID, "0", "pgdata")
	data := float64(duBytes(b, pgdata) - duBytes(b, filepath.Join(pgdata, "pg_wal")))
	with := usedBytes(b, dir)
	if err := os.RemoveAll(snapshots); err != nil {
		b.Fatal(err)
	}
	without := usedBytes(b, dir)
	cost := float64(with - without)
	b.ReportMetric(data/(1<<20), "data-MB")
	b.ReportMetric(cost/(1<<20), "snapshots-MB")
	b.ReportMetric((data+cost)/data, "total/data")
	b.Logf("%d snapshots of %.0f MB of data, 5%% changed before each: %.0f MB on disk; data and snapshots %.2f times the data",
		len(kept), data/(1<<20), cost/(1<<20), (data+cost)/data)
}

// snapshotAfter waits for a complete snapshot that started after since
// and returns its directory's name.
func snapshotAfter(b *testing.B, dir string, since time.Time, within time.Duration) string {
	b.Helper()
	deadline := time.Now().Add(within)
	for {
		manifests, _ := filepath.Glob(filepath.Join(dir, "*", "manifest.json"))
		for _, m := range manifests {
			if strings.HasPrefix(filepath.Base(filepath.Dir(m)), ".") {
				continue // still being written
			}
			var snap struct{ Started time.Time }
			if raw, err := os.ReadFile(m); err == nil && json.Unmarshal(raw, &snap) == nil && snap.Started.After(since) {
				return filepath.Base(filepath.Dir(m))
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("no snapshot in %s started after %v within %v", dir, since, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pruneSnapshotsExcept removes every published snapshot but the kept ones
// (one being written, under a dot name, stays: it is removed once
// published).
func pruneSnapshotsExcept(b *testing.B, dir string, kept []string) {
	b.Helper()
	keep := map[string]bool{}
	for _, k := range kept {
		keep[k] = true
	}
	manifests, _ := filepath.Glob(filepath.Join(dir, "*", "manifest.json"))
	for _, m := range manifests {
		snap := filepath.Dir(m)
		if name := filepath.Base(snap); !keep[name] && !strings.HasPrefix(name, ".") {
			if err := os.RemoveAll(snap); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// usedBytes is the filesystem's used space once everything written or
// removed is committed.
func usedBytes(b *testing.B, dir string) int64 {
	b.Helper()
	syncDisk(b)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		b.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}
