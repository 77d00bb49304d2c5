package backup

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

const segSize16MB = 16 << 20

func TestParseLSN(t *testing.T) {
	for in, want := range map[string]LSN{"0/0": 0, "0/1A2B": 0x1A2B, "16/B374D848": 0x16_B374D848, "FFFFFFFF/FFFFFFFF": ^LSN(0)} {
		got, err := ParseLSN(in)
		if err != nil || got != want || got.String() != in && in != "0/0" {
			t.Errorf("ParseLSN(%q) = %v (%s), %v; want %v", in, uint64(got), got, err, uint64(want))
		}
	}
	for _, bad := range []string{"", "12", "x/1", "1/x", "100000000/0"} {
		if _, err := ParseLSN(bad); err == nil {
			t.Errorf("ParseLSN(%q) accepted", bad)
		}
	}
}

func TestWALSegmentNames(t *testing.T) {
	// As PostgreSQL names them (XLogFileName), 16 MB segments: 256 per
	// "xlogid".
	for _, c := range []struct {
		tli  uint32
		l    LSN
		want string
	}{
		{1, 0x0, "000000010000000000000000"},
		{1, 0x2000028, "000000010000000000000002"},
		{2, 0x1_FF000000, "0000000200000001000000FF"},
		{3, 0x2_00000000, "000000030000000200000000"},
	} {
		seg := segmentOf(c.tli, c.l, segSize16MB)
		if got := seg.name(segSize16MB); got != c.want {
			t.Errorf("segment of %d/%s = %s, want %s", c.tli, c.l, got, c.want)
		}
		back, err := parseSegmentName(c.want, segSize16MB)
		if err != nil || back != seg {
			t.Errorf("parseSegmentName(%s) = %+v, %v; want %+v", c.want, back, err, seg)
		}
	}
	if _, err := parseSegmentName("00000001000000000000000g", segSize16MB); err == nil {
		t.Error("a lower-case/non-hex name parsed")
	}
}

func TestParseWaldumpCommit(t *testing.T) {
	line := "rmgr: Transaction len (rec/tot):     66/    66, tx:        723, lsn: 0/015006D0, prev 0/01500630, desc: COMMIT 2026-11-22 00:50:19.164389 UTC; inval msgs: snapshot 2396"
	c, ok := parseWaldumpCommit(line)
	want := time.Date(2026, 11, 22, 0, 50, 19, 164389000, time.UTC)
	if !ok || !c.Time.Equal(want) || c.LSN != 0x015006D0 {
		t.Errorf("commit line: %+v %v", c, ok)
	}
	abort := "rmgr: Transaction len (rec/tot):     34/    34, tx:        900, lsn: 1/00000028, prev 0/FFFFFFD0, desc: ABORT 2026-11-22 00:50:20.000001 UTC"
	if c, ok := parseWaldumpCommit(abort); !ok || c.LSN != 0x1_00000028 {
		t.Errorf("abort line: %+v %v", c, ok)
	}
	for _, other := range []string{
		"rmgr: Transaction len (rec/tot): 258/258, tx: 0, lsn: 0/01500A60, prev 0/01500A28, desc: RUNNING_XACTS nextXid 725",
		"rmgr: Transaction len (rec/tot): 66/66, tx: 723, lsn: 0/015006D0, prev 0/01500630, desc: COMMIT_PREPARED 5: 2026-11-22 00:50:19.164389 UTC",
		"garbage",
	} {
		if _, ok := parseWaldumpCommit(other); ok {
			t.Errorf("not a commit, but parsed: %s", other)
		}
	}
}

func TestPruneArchive(t *testing.T) {
	dir := t.TempDir()
	files := []string{
		"000000010000000000000001", "000000010000000000000002", "000000010000000000000002.00000028.backup",
		"000000010000000000000003.partial", "00000002.history", "000000020000000000000003",
		"000000020000000000000004", "archtemp.000000020000000000000005.123.456",
		"archtemp.000000010000000000000001.99.100",
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := pruneArchive(dir, "000000020000000000000003")
	if err != nil || removed != 4 {
		t.Fatalf("pruneArchive: removed %d, %v", removed, err)
	}
	entries, _ := os.ReadDir(dir)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	want := []string{"000000010000000000000003.partial", "00000002.history", "000000020000000000000003",
		"000000020000000000000004", "archtemp.000000020000000000000005.123.456"}
	if !slices.Equal(left, want) {
		t.Errorf("left %q, want %q", left, want)
	}
	if _, err := pruneArchive(filepath.Join(dir, "missing"), "000000020000000000000003"); err != nil {
		t.Errorf("pruning a missing archive: %v", err)
	}
}

func TestExpiredSnapshots(t *testing.T) {
	day := 24 * time.Hour
	now := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	var snaps []Snapshot
	for d := 9; d >= 0; d-- { // one a day, the newest today
		snaps = append(snaps, Snapshot{Name: now.Add(-time.Duration(d) * day).Format(snapshotNameLayout), Finished: now.Add(-time.Duration(d) * day)})
	}
	// 7 days kept: the snapshot 7 days old stays (so 7 days back stays
	// restorable); the two older go.
	if got := expiredSnapshots(snaps, now.Add(-7*day)); len(got) != 2 || got[1].Finished != now.Add(-8*day) {
		t.Errorf("expired: %+v", got)
	}
	// The newest stays whatever its age.
	if got := expiredSnapshots(snaps[:3], now); len(got) != 2 {
		t.Errorf("all old: %d expired, want all but the newest", len(got))
	}
	if got := expiredSnapshots(nil, now); len(got) != 0 {
		t.Errorf("none: %v", got)
	}
}
