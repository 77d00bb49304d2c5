package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"dbcloud/internal/pgtest"
)

// TestStorageLimit_DefaultFilesystem is issue 30's sequence on the test
// machine's own filesystem (ext4 here) with dbcloud's defaults, no storage
// flag but the limit: a tenant fills its service until it is read-only,
// then tries every other way to grow it (WAL of its own through
// pg_logical_emit_message, a sort that spills with work_mem=64kB, a large
// object). The service must end read-only within its stated margin
// (its limit plus max(10%, 512 MiB), where the filesystem stops it),
// another service on the same server must still write, the API must
// still write, and every row acknowledged before read-only must be there.
func TestStorageLimit_DefaultFilesystem(t *testing.T) {
	const limitMB = 400
	const hardLimitMB = limitMB + 512 // storage.go hardLimit: max(10%, 512 MiB) above
	s := newServer(t, "--storage-shared-mib", strconv.Itoa(limitMB))
	host, err := statfsType(filepath.Dir(s.runtimeDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the test machine's filesystem: %s", host)
	if log, _ := os.ReadFile(filepath.Join(s.dir, "server.log")); bytes.Contains(log, []byte("limits not enforced")) {
		t.Errorf("with the defaults the server says limits are not enforced:\n%s", grepLines(log, "runtime storage"))
	}

	a := s.create(map[string]any{"name": "fills", "cpu_millis": "shared", "memory_gbs": "shared"})
	b := s.create(map[string]any{"name": "other", "cpu_millis": "shared", "memory_gbs": "shared"})
	svcA := s.waitStatus(a.ServiceID, "READY", 90*time.Second)
	svcB := s.waitStatus(b.ServiceID, "READY", 90*time.Second)
	ctx := context.Background()
	connA := s.mustConnect(svcA, a.InitialPassword)
	connB := s.mustConnect(svcB, b.InitialPassword)
	if _, err := connA.Exec(ctx, "CREATE TABLE fill (id bigserial PRIMARY KEY, pad text)"); err != nil {
		t.Fatal(err)
	}

	// Fill until read-only, counting every row whose commit was
	// acknowledged.
	var committed int64
	used := storageMB(s.waitStorage(a.ServiceID, 30*time.Second, "measured", func(st storageStatus) bool { return storageMB(st) > 0 }))
	for round := 0; ; round++ {
		if round > 40 {
			t.Fatalf("never read-only at %d of %d MB", used, limitMB)
		}
		chunkMB := max(1, (limitMB*95/100-used)/8)
		tag, err := connA.Exec(ctx, "INSERT INTO fill (pad) SELECT repeat(md5(g::text), 8) FROM generate_series(1, $1) g", chunkMB*3500)
		if state := pgtest.SQLState(err); state == "25006" {
			t.Logf("read-only after %d rounds at %d MB, %d rows committed: %v", round, used, committed, err)
			break
		} else if err != nil {
			t.Fatalf("write at %d of %d MB: %v (SQLSTATE %s), want 25006 before the quota", used, limitMB, err, state)
		}
		committed += tag.RowsAffected()
		used = s.storageAfterWrite(a.ServiceID, used)
	}

	// Every other way to add to the service. Each must fail; the first
	// and the last are the guard's (they need its read-only mode to cover
	// them), the sort temp_file_limit's.
	attempts := []struct{ name, sql string }{
		{"pg_logical_emit_message", "SELECT pg_logical_emit_message(true, 'x', repeat('m', 10*1024*1024)) FROM generate_series(1, 30)"},
		{"sort with work_mem=64kB", "SELECT count(*) FROM (SELECT g, md5(g::text) AS h FROM generate_series(1, 20000000) g ORDER BY h) s"},
		{"lo_from_bytea", "SELECT lo_from_bytea(0, convert_to(repeat('x', 50*1024*1024), 'UTF8'))"},
	}
	if _, err := connA.Exec(ctx, "SET work_mem = '64kB'"); err != nil {
		t.Fatal(err)
	}
	for _, at := range attempts {
		_, err := connA.Exec(ctx, at.sql)
		if err == nil {
			t.Errorf("%s on a read-only service: accepted, want refused", at.name)
			continue
		}
		t.Logf("%s: refused, SQLSTATE %s: %v", at.name, pgtest.SQLState(err), err)
	}

	// What the service keeps, as the filesystem accounts it now, and
	// where the filesystem stops it.
	dir := filepath.Join(s.runtimeDir(), "services", a.ServiceID)
	onDisk, quota := serviceBytes(t, dir)
	t.Logf("service %s keeps %d MB; quota %d MB; limit %d MB, margin to %d MB", a.ServiceID, onDisk>>20, quota>>20, limitMB, hardLimitMB)
	if quota == 0 || quota>>20 > hardLimitMB {
		t.Errorf("the filesystem stops the service at %d MB (0: never), want at most its limit and margin, %d MB", quota>>20, hardLimitMB)
	}
	if onDisk>>20 > hardLimitMB {
		t.Errorf("the service keeps %d MB, beyond its limit of %d MB and margin (%d MB)", onDisk>>20, limitMB, hardLimitMB)
	}
	st := s.waitStorage(a.ServiceID, 30*time.Second, "READY, saying it is at its storage limit", func(st storageStatus) bool {
		return st.Status == "READY" && strings.Contains(st.StatusReason, "storage limit")
	})
	t.Logf("status: %s %q, storage_mb %d", st.Status, st.StatusReason, storageMB(st))
	if _, err := connA.Exec(ctx, "INSERT INTO fill (pad) VALUES ('one more')"); pgtest.SQLState(err) != "25006" {
		t.Errorf("write on the read-only service: %v, want 25006", err)
	}

	// The others still write: another tenant, and the API.
	if _, err := connB.Exec(ctx, "CREATE TABLE t AS SELECT g FROM generate_series(1, 100000) g"); err != nil {
		t.Errorf("the other service's write: %v", err)
	}
	if code := s.call("POST", s.services()+"/"+b.ServiceID+"/rename", map[string]string{"name": "other-renamed"}, nil); code != 200 {
		t.Errorf("rename through the API: %d, want 200", code)
	}

	// Nothing acknowledged is lost, on a fresh connection.
	fresh, err := s.connect(ctx, svcA, a.InitialPassword)
	if err != nil {
		t.Fatalf("connect to the read-only service: %v", err)
	}
	defer fresh.Close(ctx)
	var rows int64
	if err := fresh.QueryRow(ctx, "SELECT count(*) FROM fill").Scan(&rows); err != nil {
		t.Fatalf("read the read-only service: %v", err)
	}
	if rows != committed {
		t.Errorf("fill has %d rows, want the %d acknowledged", rows, committed)
	}
}

// serviceBytes is what a service's directory keeps and the quota the
// filesystem stops it at: where it is a btrfs volume, what its quota
// group references (what the quota limits), after a commit, and its
// limit; elsewhere its blocks as du counts them, and no quota (0).
func serviceBytes(t *testing.T, dir string) (used, quota int64) {
	t.Helper()
	if fs, _ := statfsType(dir); fs == "btrfs" {
		out, err := exec.Command("btrfs", "qgroup", "show", "--raw", "-re", "-f", "--sync", dir).Output()
		if err == nil {
			for _, line := range strings.Split(string(out), "\n") {
				f := strings.Fields(line)
				if len(f) >= 4 && strings.HasPrefix(f[0], "0/") {
					used, err := strconv.ParseInt(f[1], 10, 64)
					if err != nil {
						t.Fatalf("qgroup show: %q: %v", line, err)
					}
					quota, _ := strconv.ParseInt(f[3], 10, 64) // "none": 0
					return used, quota
				}
			}
		}
	}
	out, err := exec.Command("du", "-s", "--block-size=1", dir).Output()
	if err != nil {
		t.Fatalf("du %s: %v", dir, err)
	}
	n, err := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	if err != nil {
		t.Fatalf("du %s: %q: %v", dir, out, err)
	}
	return n, 0
}

// statfsType names the filesystem holding dir.
func statfsType(dir string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", err
	}
	switch st.Type {
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs", nil
	case unix.EXT4_SUPER_MAGIC:
		return "ext4", nil
	case unix.XFS_SUPER_MAGIC:
		return "xfs", nil
	case unix.TMPFS_MAGIC:
		return "tmpfs", nil
	}
	return fmt.Sprintf("0x%x", st.Type), nil
}

// grepLines returns the lines of b that contain s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
