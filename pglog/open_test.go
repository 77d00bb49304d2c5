package pglog

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestOpenRegular: what a tenant with a shell could put in a log directory
// in place of a log file (a symlink to another file, a FIFO) is refused at
// open, without following the link and without waiting for a FIFO writer.
func TestOpenRegular(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(secret, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	regular := filepath.Join(dir, "postgresql-2026-01-01_000000.json")
	if err := os.WriteFile(regular, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "postgresql-2026-01-01_010000.json")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "postgresql-2026-01-01_020000.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}

	f, err := openRegular(regular)
	if err != nil {
		t.Fatalf("regular file: %v", err)
	}
	f.Close()
	for _, path := range []string{link, fifo, dir} {
		done := make(chan error, 1)
		go func() {
			f, err := openRegular(path)
			if err == nil {
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, errNotRegular) {
				t.Errorf("%s: got %v, want errNotRegular", path, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: open still blocked after 10 s", path)
		}
	}

	// A log directory that is a symlink is refused, not listed.
	linkedDir := filepath.Join(t.TempDir(), "log")
	if err := os.Symlink(dir, linkedDir); err != nil {
		t.Fatal(err)
	}
	if files, err := listFiles(linkedDir); err == nil {
		t.Errorf("a symlinked log directory was listed: %v", files)
	}

	// Pruning neither counts nor removes what is not a regular file, and
	// never touches a link's target.
	if _, err := Prune(dir, time.Nanosecond, 1, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{link, fifo, secret} {
		if _, err := os.Lstat(path); err != nil {
			t.Errorf("%s removed by Prune: %v", path, err)
		}
	}
}
