package backup

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/internal/localtest"
)

// The WAL archive is written by the service's OS user. A FIFO and a link
// to a root-only file named like the newest segments must neither hang the
// recovery window's computation nor be read as root.
func TestLastArchivedCommit_TenantFiles(t *testing.T) {
	id := localtest.ServiceUser(t)
	base := localtest.Base(t)
	archive := filepath.Join(base, "archive")
	if err := os.Mkdir(archive, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(archive, int(id.UID), int(id.GID)); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, make([]byte, 16<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	localtest.AsUser(t, id, "cd "+archive+"; mkfifo 000000010000000000000003; ln -s "+victim+" 000000010000000000000002")
	b := New(nil, pgbin.Dir(), localtest.Logger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type answer struct {
		c   *ArchivedCommit
		err error
	}
	done := make(chan answer, 1)
	go func() {
		c, err := b.LastArchivedCommit(context.Background(), "", archive, "000000010000000000000001", 16<<20)
		done <- answer{c, err}
	}()
	select {
	case a := <-done:
		t.Logf("LastArchivedCommit: %v, %v", a.c, a.err)
		if a.c != nil {
			t.Errorf("a commit found in the tenant's FIFO or link: %+v", a.c)
		}
	case <-ctx.Done():
		t.Fatalf("LastArchivedCommit still blocked on the archive's FIFO: %v", ctx.Err())
	}
}
