package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDiskFull fills the filesystem under dbcloud's data directory (an
// ext4 image of the test's own) as an unprivileged user would, the way a
// tenant's data fills a disk: API reads still answer; a create, which
// needs disk, answers 503; a resize, which does not (its storage limit
// stays 1 GiB), is accepted; a postmaster that dies meanwhile is not
// restarted into a crash loop, and status_reason says why. Once space is
// freed everything accepted completes and nothing is lost. The runtime
// stays on that ext4 (--storage-image-gib 0): the disk that fills is the
// one the services are on.
func TestDiskFull(t *testing.T) {
	// Large enough for the admission's 1 GiB per new instance, and for a
	// 1 GiB storage limit beside the host's reserve of 4 GiB.
	dir := mountImage(t, "ext4", "8G")
	s := newServerIn(t, dir, "--pool-size", "1", "--storage-image-gib", "0",
		"--storage-shared-mib", "1024", "--storage-mib-per-memory-gib", "256")

	created := s.create(map[string]any{"name": "full", "cpu_millis": "shared", "memory_gbs": "shared"})
	svc := s.waitStatus(created.ServiceID, "READY", 90*time.Second)
	ctx := context.Background()
	conn := s.mustConnect(svc, created.InitialPassword)
	if _, err := conn.Exec(ctx, "CREATE TABLE kept AS SELECT g FROM generate_series(1, 10000) g"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	filler := fillDisk(t, dir, "filler")

	if _, code := s.get(svc.ServiceID); code != 200 {
		t.Fatalf("GET on a full disk: %d", code)
	}
	var refused service
	if code := s.call("POST", s.services(), map[string]any{"name": "more"}, &refused); code != 503 || refused.Code != "UNAVAILABLE" {
		t.Fatalf("create on a full disk: %d %+v, want 503 UNAVAILABLE", code, refused)
	}
	var resized service
	path := s.services() + "/" + svc.ServiceID
	if code := s.call("POST", path+"/resize", map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}, &resized); code != 202 {
		t.Fatalf("resize on a full disk: %d %+v", code, resized)
	}
	// The postmaster dies (as at a PANIC on a WAL write): the runtime does
	// not start it again while the disk is full, and says so.
	for _, pid := range s.postmasters(svc.ServiceID) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, _ := s.get(svc.ServiceID)
		if got.Status == "UNSTABLE" && strings.Contains(got.StatusReason, "disk") {
			t.Logf("on a full disk: %s: %s", got.Status, got.StatusReason)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("service on a full disk: %s %q, want UNSTABLE saying the disk is full", got.Status, got.StatusReason)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if pids := s.postmasters(svc.ServiceID); len(pids) != 0 {
		t.Fatalf("postmaster %v started on a full disk", pids)
	}

	if err := os.RemoveAll(filler); err != nil {
		t.Fatal(err)
	}
	svc = s.waitStatus(svc.ServiceID, "READY", 3*time.Minute)
	var after struct {
		Resources []struct {
			Spec struct {
				CPUMillis int `json:"cpu_millis"`
			} `json:"spec"`
		} `json:"resources"`
	}
	if code := s.call("GET", path, nil, &after); code != 200 || len(after.Resources) == 0 || after.Resources[0].Spec.CPUMillis != 1000 {
		t.Fatalf("the resize accepted on a full disk did not complete: %d %+v", code, after)
	}
	conn = s.mustConnect(svc, created.InitialPassword)
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n); err != nil || n != 10000 {
		t.Fatalf("rows after the disk was full: %d, %v; want 10000", n, err)
	}
	more := s.create(map[string]any{"name": "more"})
	s.waitStatus(more.ServiceID, "READY", 90*time.Second)
}

// fillDisk fills the filesystem at dir as the unprivileged user nobody,
// in a directory of the given name, until nothing is left for
// unprivileged writers (ext4 keeps its root reserve, as on a real host),
// and returns the directory to remove to free it.
func fillDisk(t *testing.T, dir, name string) string {
	t.Helper()
	filler := filepath.Join(dir, name)
	if err := os.Mkdir(filler, 0o700); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	if err := os.Chown(filler, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		free := freeBytes(t, dir)
		if free < 1<<20 {
			t.Logf("filled: %d KiB left for unprivileged writers", free>>10)
			return filler
		}
		if i > 20 {
			t.Fatalf("the disk never filled: %d bytes free", free)
		}
		f := filepath.Join(filler, "f"+strconv.Itoa(i))
		// fallocate may stop short of the last blocks (its own metadata);
		// the loop takes what is left.
		exec.Command("setpriv", "--reuid", strconv.Itoa(nobody), "--regid", strconv.Itoa(nobody), "--clear-groups",
			"fallocate", "-l", strconv.FormatInt(free, 10), f).Run()
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			exec.Command("setpriv", "--reuid", strconv.Itoa(nobody), "--regid", strconv.Itoa(nobody), "--clear-groups",
				"dd", "if=/dev/zero", "of="+f, "bs=64k", "status=none").Run()
		}
	}
}

// mountImage makes a sparse image file of the given size, formats it
// (mkfs.ext4 or mkfs.btrfs), loop-mounts it on a new directory and
// returns the directory: a filesystem of the test's own, to fill or to
// measure without the rest of the machine's writes. Cleanup unmounts it
// (newServerIn's cleanup does it first when a server runs on it).
func mountImage(t testing.TB, fstype, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a filesystem image needs root")
	}
	img := filepath.Join(t.TempDir(), fstype+".img")
	dir, err := os.MkdirTemp("", "dbcloud-e2e-"+fstype+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unmountUnder(t, dir)
		os.Remove(dir)
	})
	for _, cmd := range [][]string{{"truncate", "-s", size, img}, {"mkfs." + fstype, "-q", img}, {"mount", "-o", "loop", img, dir}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	return dir
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}
