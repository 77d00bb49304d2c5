package proc

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"dbcloud/runtime/local/internal/localtest"
)

// Spawn opens the log of a process as root in a directory the service's
// user writes: a link planted as the log is not followed (the child's
// output would land in, and extend, a root-only file).
func TestSpawn_LogLink(t *testing.T) {
	id := localtest.ServiceUser(t)
	base := localtest.Base(t)
	dir := filepath.Join(base, "log")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, int(id.UID), int(id.GID)); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(base, "victim")
	const victimText = "root only\n"
	if err := os.WriteFile(victim, []byte(victimText), 0o600); err != nil {
		t.Fatal(err)
	}
	localtest.AsUser(t, id, "ln -s "+victim+" "+filepath.Join(dir, "app.log"))
	sup := NewSupervisor()
	c, _, err := sup.Spawn(Spec{Path: "/bin/echo", Args: []string{"written through the link"}, Dir: "/",
		Credential: id.Credential(), LogPath: filepath.Join(dir, "app.log")})
	t.Logf("Spawn: %v", err)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if !sup.Wait(ctx, c.PID, 10*time.Second) {
			t.Fatalf("echo (pid %d) did not exit", c.PID)
		}
	}
	got, rerr := os.ReadFile(victim)
	if rerr != nil || string(got) != victimText {
		t.Errorf("root-only victim now %q, %v; want it unchanged", got, rerr)
	}
	if err == nil {
		t.Error("Spawn with a linked log: no error")
	}
}
