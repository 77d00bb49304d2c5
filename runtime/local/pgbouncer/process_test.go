package pgbouncer

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"dbcloud/runtime/local/internal/localtest"
)

// victimText is what a root-only file holds before and after each attack.
const victimText = "root only: must never change\n"

// mustTenantDir makes a directory owned by a real service identity, as the
// pooler's is, and beside it a root-only victim file.
func mustTenantDir(t *testing.T) (dir, victim string, as func(script string)) {
	t.Helper()
	id := localtest.ServiceUser(t)
	base := localtest.Base(t)
	dir = filepath.Join(base, "pooler")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, int(id.UID), int(id.GID)); err != nil {
		t.Fatal(err)
	}
	victim = filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte(victimText), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, victim, func(script string) { localtest.AsUser(t, id, "cd "+dir+"; "+script) }
}

func checkVictim(t *testing.T, victim string) {
	t.Helper()
	got, err := os.ReadFile(victim)
	if err != nil || string(got) != victimText {
		t.Fatalf("root-only victim now %d bytes (%q...), %v; want it unchanged", len(got), got[:min(len(got), 32)], err)
	}
}

// The reproduction of issue 30: the service's user replaces the pooler's
// log by a link to a 17 MB file of its own and its rotated copy by a link
// to a root-only file; the rotation (run by root at every ensure) must not
// write through either link. With the log a real file of its own, the
// link as the rotated copy is refused too; with neither, it rotates.
func TestRotateLog_TenantLinks(t *testing.T) {
	const big = `head -c 17825792 /dev/zero | tr '\0' x > `
	for _, c := range []struct{ name, script string }{
		{"LogLink", big + "payload; ln -s payload " + poolerLogFile + "; ln -s VICTIM " + poolerLogFile + ".1"},
		{"RotatedLink", big + poolerLogFile + "; ln -s VICTIM " + poolerLogFile + ".1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, victim, as := mustTenantDir(t)
			as(strings.ReplaceAll(c.script, "VICTIM", victim))
			err := rotateLog(filepath.Join(dir, poolerLogFile))
			t.Logf("rotateLog: %v", err)
			checkVictim(t, victim)
			if err == nil {
				t.Error("rotateLog over links: no error, want the links refused")
			}
		})
	}
	t.Run("OK", func(t *testing.T) {
		dir, _, as := mustTenantDir(t)
		as(big + poolerLogFile)
		if err := rotateLog(filepath.Join(dir, poolerLogFile)); err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]int64{poolerLogFile: 0, poolerLogFile + ".1": 17825792} {
			if fi, err := os.Lstat(filepath.Join(dir, name)); err != nil || fi.Size() != want {
				t.Errorf("%s after rotation: %v, %v; want %d bytes", name, fi, err, want)
			}
		}
	})
}

// A FIFO where the log is expected makes the reload's read fail at once,
// not wait for a writer.
func TestReadFrom_FIFO(t *testing.T) {
	dir, _, as := mustTenantDir(t)
	as("mkfifo " + poolerLogFile)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan []byte, 1)
	go func() { done <- readFrom(filepath.Join(dir, poolerLogFile), 0) }()
	select {
	case data := <-done:
		if len(bytes.TrimSpace(data)) != 0 {
			t.Errorf("readFrom(FIFO) = %q, want nothing", data)
		}
	case <-ctx.Done():
		t.Fatalf("readFrom on a FIFO still blocked: %v", ctx.Err())
	}
}
