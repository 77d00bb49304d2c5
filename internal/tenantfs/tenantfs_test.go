package tenantfs

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fixture is a directory a tenant could have filled, beside a victim file
// and directory outside it that root must never touch through it.
type fixture struct {
	dir, victim, victimDir string
}

const victimText = "root's own file\n"

func mustFixture(t *testing.T) fixture {
	t.Helper()
	base := t.TempDir()
	f := fixture{dir: filepath.Join(base, "tenant"), victim: filepath.Join(base, "victim"), victimDir: filepath.Join(base, "victimdir")}
	for _, d := range []string{f.dir, f.victimDir, filepath.Join(f.dir, "real")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, f.victim, victimText)
	mustWrite(t, filepath.Join(f.victimDir, "f"), victimText)
	mustWrite(t, filepath.Join(f.dir, "plain"), "tenant's\n")
	mustWrite(t, filepath.Join(f.dir, "real", "f"), "tenant's\n")
	for link, target := range map[string]string{"link": f.victim, "linkdir": f.victimDir} {
		if err := os.Symlink(target, filepath.Join(f.dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(f.dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(f.victim, filepath.Join(f.dir, "hardlink")); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 { // /dev/null's numbers
		if err := unix.Mknod(filepath.Join(f.dir, "device"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func mustWrite(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f fixture) checkVictim(t *testing.T) {
	t.Helper()
	for _, p := range []string{f.victim, filepath.Join(f.victimDir, "f")} {
		got, err := os.ReadFile(p)
		if err != nil || string(got) != victimText {
			t.Errorf("victim %s = %q, %v; want %q untouched", p, got, err, victimText)
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err == nil && st.Uid != uint32(os.Geteuid()) {
			t.Errorf("victim %s owned by uid %d now", p, st.Uid)
		}
	}
}

// modes runs fn with openat2 and with the per-component fallback.
func modes(t *testing.T, fn func(t *testing.T, open func(path string) *Dir)) {
	for _, fallback := range []bool{false, true} {
		name := "Openat2"
		if fallback {
			name = "Fallback"
		}
		t.Run(name, func(t *testing.T) {
			fn(t, func(path string) *Dir {
				t.Helper()
				d, err := OpenDir(path)
				if err != nil {
					t.Fatal(err)
				}
				d.noOpenat2 = fallback
				t.Cleanup(func() { d.Close() })
				return d
			})
		})
	}
}

// withDeadline runs fn and fails the test if it does not return within a
// bound: a read blocked on a FIFO would otherwise hang the test binary.
func withDeadline(t *testing.T, what string, fn func() error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		t.Fatalf("%s: still blocked: %v", what, ctx.Err())
		return nil
	}
}

func TestDir_Refuses(t *testing.T) {
	modes(t, func(t *testing.T, open func(string) *Dir) {
		f := mustFixture(t)
		d := open(f.dir)
		cases := []struct {
			name string
			op   string
			do   func() error
			want error
		}{
			{"link", "read", func() error { _, err := d.ReadFile("link"); return err }, ErrSymlink},
			{"link", "truncate", func() error { return d.Truncate("link", 0) }, ErrSymlink},
			{"link", "create-trunc", func() error {
				_, err := d.OpenFile("link", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
				return err
			}, ErrSymlink},
			{"link", "append", func() error { _, err := d.OpenFile("link", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); return err }, ErrSymlink},
			{"linkdir/f", "read", func() error { _, err := d.ReadFile("linkdir/f"); return err }, ErrSymlink},
			{"linkdir/f", "truncate", func() error { return d.Truncate("linkdir/f", 0) }, ErrSymlink},
			{"linkdir/f", "lstat", func() error { _, err := d.Lstat("linkdir/f"); return err }, ErrSymlink},
			{"linkdir/f", "chown", func() error { return d.Lchown("linkdir/f", 4242, 4242) }, ErrSymlink},
			{"linkdir/f", "remove", func() error { return d.Remove("linkdir/f") }, ErrSymlink},
			{"linkdir", "opendir", func() error { _, err := d.OpenDir("linkdir"); return err }, ErrSymlink},
			{"../victim", "read", func() error { _, err := d.ReadFile("../victim"); return err }, ErrSymlink},
			{"fifo", "read", func() error { _, err := d.ReadFile("fifo"); return err }, ErrNotRegular},
			{"fifo", "append", func() error { _, err := d.OpenFile("fifo", os.O_WRONLY|os.O_APPEND, 0); return err }, nil},
			{"real", "read", func() error { _, err := d.ReadFile("real"); return err }, ErrNotRegular},
			{"hardlink", "read", func() error { _, err := d.ReadFile("hardlink"); return err }, ErrNotRegular},
			{"hardlink", "truncate", func() error { return d.Truncate("hardlink", 0) }, ErrNotRegular},
		}
		if os.Geteuid() == 0 {
			cases = append(cases,
				struct {
					name, op string
					do       func() error
					want     error
				}{"device", "read", func() error { _, err := d.ReadFile("device"); return err }, ErrNotRegular})
		}
		for _, c := range cases {
			err := withDeadline(t, c.op+" "+c.name, c.do)
			switch {
			case err == nil:
				t.Errorf("%s %s: no error, want one", c.op, c.name)
			case c.want != nil && !errors.Is(err, c.want):
				t.Errorf("%s %s: %v, want %v", c.op, c.name, err, c.want)
			}
		}
		f.checkVictim(t)
	})
}

func TestDir_Works(t *testing.T) {
	modes(t, func(t *testing.T, open func(string) *Dir) {
		f := mustFixture(t)
		d := open(f.dir)
		if got, err := d.ReadFile("real/f"); err != nil || string(got) != "tenant's\n" {
			t.Errorf("ReadFile(real/f) = %q, %v", got, err)
		}
		w, err := d.OpenFile("new", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteString("abc"); err != nil {
			t.Fatal(err)
		}
		w.Close()
		if err := d.Truncate("new", 1); err != nil {
			t.Fatal(err)
		}
		if fi, err := d.Lstat("new"); err != nil || fi.Size() != 1 || !fi.Mode().IsRegular() {
			t.Errorf("Lstat(new) = %v, %v; want a regular file of 1 byte", fi, err)
		}
		if fi, err := d.Lstat("link"); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("Lstat(link) = %v, %v; want the link itself", fi, err)
		}
		if target, err := d.Readlink("link"); err != nil || target != f.victim {
			t.Errorf("Readlink(link) = %q, %v", target, err)
		}
		if err := d.Rename("link", "moved"); err != nil {
			t.Fatal(err)
		}
		if err := d.Remove("moved"); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Lstat("moved"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Lstat(moved) after Remove: %v, want not exist", err)
		}
		if _, err := d.ReadFile("missing"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("ReadFile(missing): %v, want not exist", err)
		}
		infos, err := d.ReadDir()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, fi := range infos {
			names = append(names, fi.Name())
		}
		if len(names) == 0 || names[0] > names[len(names)-1] {
			t.Errorf("ReadDir names = %v, want sorted entries", names)
		}
		f.checkVictim(t)
	})
}

func TestChownTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	modes(t, func(t *testing.T, open func(string) *Dir) {
		f := mustFixture(t)
		if err := os.Remove(filepath.Join(f.dir, "hardlink")); err != nil {
			t.Fatal(err)
		}
		const id = 4242
		n, err := open(f.dir).ChownTree(id, id)
		if err != nil {
			t.Fatal(err)
		}
		if n < 6 {
			t.Errorf("ChownTree re-owned %d entries, want every one (at least 6)", n)
		}
		for _, p := range []string{f.dir, filepath.Join(f.dir, "real", "f"), filepath.Join(f.dir, "link"), filepath.Join(f.dir, "fifo")} {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil || st.Uid != id || st.Gid != id {
				t.Errorf("%s: uid %d gid %d (%v), want %d", p, st.Uid, st.Gid, err, id)
			}
		}
		f.checkVictim(t)
	})
}

// TestOpenDir_Link: the directory handed to OpenDir must not itself be a
// link.
func TestOpenDir_Link(t *testing.T) {
	f := mustFixture(t)
	_, err := OpenDir(filepath.Join(f.dir, "linkdir"))
	if !errors.Is(err, ErrSymlink) {
		t.Errorf("OpenDir(link to a directory) = %v, want %v", err, ErrSymlink)
	}
}

// DialUnix reaches a socket of the directory and refuses a link to one
// elsewhere, and anything that is not a socket.
func TestDialUnix(t *testing.T) {
	modes(t, func(t *testing.T, open func(string) *Dir) {
		f := mustFixture(t)
		elsewhere := filepath.Join(f.victimDir, "s")
		l, err := net.Listen("unix", elsewhere)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		own, err := net.Listen("unix", filepath.Join(f.dir, "own"))
		if err != nil {
			t.Fatal(err)
		}
		defer own.Close()
		if err := os.Symlink(elsewhere, filepath.Join(f.dir, "sock")); err != nil {
			t.Fatal(err)
		}
		d := open(f.dir)
		ctx := context.Background()
		if c, err := d.DialUnix(ctx, "own"); err != nil {
			t.Errorf("DialUnix(own socket): %v", err)
		} else {
			c.Close()
		}
		if c, err := d.DialUnix(ctx, "sock"); !errors.Is(err, ErrSymlink) {
			if c != nil {
				c.Close()
			}
			t.Errorf("DialUnix(link to a socket elsewhere) = %v, want %v", err, ErrSymlink)
		}
		if _, err := d.DialUnix(ctx, "plain"); !errors.Is(err, ErrNotSocket) {
			t.Errorf("DialUnix(regular file) = %v, want %v", err, ErrNotSocket)
		}
	})
}
