package e2e

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkUpgradeInPlace measures the downtime of an IN_PLACE upgrade
// from PostgreSQL 15 to 17 as a client sees it: the longest gap between
// two commits of a writer that commits one row at a time through the
// endpoint throughout, reconnecting when refused (the last write before
// the stop to the first write after). Beside it: the whole upgrade,
// accepted to READY (the rehearsal included). Rows: a service of 1 GiB on
// a btrfs storage image dbcloud mounts (pg_upgrade --clone) and on the
// host's ext4 (pg_upgrade --link). -short loads 32 MiB, to check the
// benchmark runs, not to measure. Run it once:
//
//	go test ./e2e -run '^$' -bench '^BenchmarkUpgradeInPlace$' -benchtime 1x -timeout 60m
func BenchmarkUpgradeInPlace(b *testing.B) {
	requirePGVersion(b, 17)
	mib := int64(1 << 10)
	if testing.Short() {
		mib = 32
	}
	for _, r := range []struct {
		name  string
		image string // --storage-image-gib: "0" is the host's filesystem
	}{{"btrfs-image-clone", "32"}, {"ext4-link", "0"}} {
		b.Run(r.name+"/"+strconv.FormatInt(mib, 10)+"MiB", func(b *testing.B) {
			s := newServer(b, "--storage-mib-per-memory-gib", "3072", "--storage-image-gib", r.image)
			var downtime, total []float64
			for range b.N {
				d, t := benchUpgradeOnce(b, s, mib)
				downtime, total = append(downtime, d.Seconds()), append(total, t.Seconds())
			}
			b.ReportMetric(medianOf(downtime), "downtime-s")
			b.ReportMetric(medianOf(total), "accept-to-ready-s")
			b.ReportMetric(10, "goal-downtime-s")
		})
	}
}

// benchUpgradeOnce creates a 15 service holding about mib MiB, upgrades
// it to 17 under a writer and returns the writer's longest gap and the
// upgrade's time from accepted to READY.
func benchUpgradeOnce(b *testing.B, s *server, mib int64) (gap, total time.Duration) {
	b.StopTimer()
	svc, w := s.upgradeBenchService(b, "bench-upgrade", mib)
	defer w.halt()
	b.StartTimer()
	began := time.Now()
	var accepted service
	if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/upgrade", map[string]any{"pg_version": 17}, &accepted); code != 202 {
		b.Fatalf("upgrade: %d %s", code, accepted.Message)
	}
	// UPGRADING is stored with the accepted request: the next READY is
	// the upgrade's end.
	after := s.waitStatus(svc.ServiceID, "READY", 30*time.Minute)
	total = time.Since(began)
	b.StopTimer()
	// The writer's first commit on the new version ends the gap.
	w.commitAfter(b, time.Now())
	acks := w.halt()
	if after.StatusReason != "" {
		b.Fatalf("the upgrade failed: %s", after.StatusReason)
	}
	gap = longestGap(acks, began, time.Time{})
	b.Logf("%d MiB: longest gap between commits %v, accepted to READY %v, %d commits", mib, gap.Round(time.Millisecond), total.Round(time.Millisecond), len(acks))
	s.call("DELETE", s.services()+"/"+svc.ServiceID, nil, nil)
	s.waitGone(svc.ServiceID, 2*time.Minute)
	return gap, total
}

// upgradeBenchService creates a service on PostgreSQL 15 holding about mib
// MiB, with a writer committing one row at a time through its endpoint
// (into w) that has committed once: what both upgrade benchmarks upgrade.
func (s *server) upgradeBenchService(b *testing.B, name string, mib int64) (service, *ackWriter) {
	b.Helper()
	created := s.create(map[string]any{"name": name, "pg_version": 15, "cpu_millis": "2000", "memory_gbs": "8"})
	svc := s.waitStatus(created.ServiceID, "READY", 2*time.Minute)
	pw := created.InitialPassword
	loadTable(b, s, svc, pw, mib)
	db := s.mustConnect(svc, pw)
	if _, err := db.Exec(context.Background(), "CREATE TABLE w (id bigserial PRIMARY KEY, n bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())"); err != nil {
		b.Fatal(err)
	}
	db.Close(context.Background())
	w := s.startWriterInto(svc, pw, 1, false, "INSERT INTO w (n) VALUES ($1)")
	w.commitAfter(b, time.Now())
	return svc, w
}
