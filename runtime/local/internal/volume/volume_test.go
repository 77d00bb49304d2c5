package volume

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseQgroupShow(t *testing.T) {
	out := []byte(`Qgroupid    Referenced    Exclusive  Max referenced  Max exclusive   Path 
--------    ----------    ---------  --------------  -------------   ---- 
0/256         20987904     16384        52428800           none   s1
`)
	u, err := parseQgroupShow(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Usage{Referenced: 20987904, Exclusive: 16384, Limit: 52428800}); u != want {
		t.Fatalf("usage = %+v, want %+v", u, want)
	}
	u, err = parseQgroupShow([]byte("0/257 4096 4096 none none s2\n"))
	if err != nil || u.Limit != 0 {
		t.Fatalf("no limit: %+v, %v", u, err)
	}
	if _, err := parseQgroupShow([]byte("Qgroupid Referenced\n")); err == nil {
		t.Fatal("a listing without a level-0 group parsed")
	}
}

func TestMountSourceIn(t *testing.T) {
	info := []byte(`22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
36 22 7:0 / /var/lib/db\040cloud rw,relatime shared:9 - btrfs /dev/loop0 rw,space_cache=v2
37 22 7:1 / /var/lib/db\040cloud rw,relatime shared:10 - btrfs /dev/loop1 rw,space_cache=v2
`)
	if got := mountSourceIn(info, "/var/lib/db cloud"); got != "/dev/loop1" {
		t.Fatalf("source = %q, want the last mount on the point", got)
	}
	if got := mountSourceIn(info, "/var/lib"); got != "" {
		t.Fatalf("source of an unmounted directory = %q", got)
	}
}

// On the host's own filesystem (ext4 here) a volume is a plain directory:
// created, removed, and reported as not accounted, so the caller measures.
func TestPlainDirectoryVolumes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fs, err := Probe(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s", dir, fs)
	if fs.Type == "btrfs" {
		t.Skip("the test directory is on btrfs; TestImageVolumes covers it")
	}
	if fs.Quotas {
		t.Fatalf("%s filesystem reported quotas", fs.Type)
	}
	v := New(fs)
	svc := filepath.Join(dir, "services", "s1")
	if err := v.Create(ctx, svc, 0o700, 64<<20); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(svc); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("volume directory: %v, %v", fi, err)
	}
	if _, err := v.Usage(ctx, svc, true); !errors.Is(err, ErrNotAccounted) {
		t.Fatalf("usage of a plain directory: %v, want ErrNotAccounted", err)
	}
	if err := v.Remove(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(svc); !os.IsNotExist(err) {
		t.Fatalf("volume still there: %v", err)
	}
}

// A storage image: mounted with quotas, volumes limited by the filesystem
// (a write past the limit fails with EDQUOT, whatever process makes it),
// clones counted once, limits raised, volumes removed with their quota
// group, the image grown, and Mount idempotent over a mounted image.
func TestImageVolumes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting an image needs root")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Fatal("mkfs.btrfs is missing: scripts/deps.sh installs btrfs-progs")
	}
	ctx := context.Background()
	base := t.TempDir()
	im := Image{File: filepath.Join(base, "runtime.img"), Dir: filepath.Join(base, "runtime"), Size: 512 << 20}
	if err := im.Mount(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := im.Unmount(context.Background()); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	if err := im.Mount(ctx); err != nil {
		t.Fatalf("second mount of a mounted image: %v", err)
	}
	fs, err := Probe(ctx, im.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if fs.Type != "btrfs" || !fs.Reflink || !fs.Quotas {
		t.Fatalf("image filesystem = %+v, want btrfs with clones and quotas", fs)
	}
	v := New(fs)
	svc := filepath.Join(im.Dir, "services", "s1")
	if err := v.Create(ctx, svc, 0o700, 32<<20); err != nil {
		t.Fatal(err)
	}
	if err := v.Create(ctx, svc, 0o700, 32<<20); err != nil {
		t.Fatalf("create of an existing volume: %v", err)
	}
	limitOf := func() int64 {
		t.Helper()
		u, err := v.Usage(ctx, svc, false)
		if err != nil {
			t.Fatal(err)
		}
		return u.Limit
	}
	// A Create of a volume this process has limited already (every start
	// of a service) runs no btrfs command: a limit changed behind its
	// back stays; SetLimit always sets it.
	if _, err := btrfs(ctx, "qgroup", "limit", strconv.Itoa(48<<20), svc); err != nil {
		t.Fatal(err)
	}
	if err := v.Create(ctx, svc, 0o700, 32<<20); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(); got != 48<<20 {
		t.Errorf("a Create of a volume at its limit set it again (limit %d)", got)
	}
	if err := v.SetLimit(ctx, svc, 32<<20); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(); got != 32<<20 {
		t.Fatalf("limit %d after SetLimit, want %d", got, 32<<20)
	}

	data := filepath.Join(svc, "data")
	writeFile(t, data, 8<<20)
	clone := filepath.Join(svc, "snapshot")
	cloneFile(t, data, clone)
	syncFS(t, svc)
	u, err := v.Usage(ctx, svc, true)
	if err != nil {
		t.Fatal(err)
	}
	if u.Limit != 32<<20 || u.Referenced < 8<<20 || u.Referenced > 9<<20 {
		t.Fatalf("usage = %+v: want 8 MiB referenced (the clone counted once), limit 32 MiB", u)
	}

	// Past the limit: the filesystem refuses, as it would PostgreSQL.
	if err := writeErr(filepath.Join(svc, "big"), 40<<20); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("write past the limit: %v, want EDQUOT", err)
	}
	os.Remove(filepath.Join(svc, "big"))
	syncFS(t, svc)
	if err := v.SetLimit(ctx, svc, 128<<20); err != nil {
		t.Fatal(err)
	}
	if err := writeErr(filepath.Join(svc, "big"), 40<<20); err != nil {
		t.Fatalf("write under the raised limit: %v", err)
	}

	if err := v.Remove(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(svc); !os.IsNotExist(err) {
		t.Fatalf("volume still there: %v", err)
	}
	if err := v.Remove(ctx, svc); err != nil {
		t.Fatalf("removing a removed volume: %v", err)
	}
	// Made again at the same path with the limit it had, it is another
	// volume and gets its limit.
	if err := v.Create(ctx, svc, 0o700, 128<<20); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(); got != 128<<20 {
		t.Fatalf("a volume made again has limit %d, want %d", got, 128<<20)
	}
	if err := v.Remove(ctx, svc); err != nil {
		t.Fatal(err)
	}

	before := fsSize(t, im.Dir)
	im.Size = 768 << 20
	if err := im.Mount(ctx); err != nil {
		t.Fatal(err)
	}
	if after := fsSize(t, im.Dir); after <= before {
		t.Fatalf("filesystem size %d after growing the image, was %d", after, before)
	}
}

func TestImageRefusesTinySize(t *testing.T) {
	im := Image{File: filepath.Join(t.TempDir(), "img"), Dir: filepath.Join(t.TempDir(), "m"), Size: 1 << 20}
	if err := im.Mount(context.Background()); err == nil {
		t.Fatal("a 1 MiB image was accepted")
	}
	if _, err := os.Stat(im.File); !os.IsNotExist(err) {
		t.Fatalf("a refused image left a file: %v", err)
	}
}

func writeFile(t *testing.T, path string, n int) {
	t.Helper()
	if err := writeErr(path, n); err != nil {
		t.Fatal(err)
	}
}

// writeErr writes n bytes that do not compress or deduplicate, and syncs
// them: btrfs reports EDQUOT at write or at sync.
func writeErr(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*7 + i/251)
	}
	for written := 0; written < n; written += len(buf) {
		buf[0]++
		if _, err := f.Write(buf); err != nil {
			return err
		}
	}
	return f.Sync()
}

func cloneFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		t.Fatalf("clone: %v", err)
	}
}

// syncFS commits the filesystem's transaction: quota accounting is
// updated at commit.
func syncFS(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
}

func fsSize(t *testing.T, dir string) uint64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * uint64(st.Bsize)
}
