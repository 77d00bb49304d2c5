package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// groupSync makes write transactions durable in groups: the writer commits
// with synchronous=NORMAL, which writes the commit's WAL frames with
// write(2) but does not fsync them, and every Update then waits here, after
// its commit and before it returns, for one fsync of the WAL file that began
// after its commit had returned. Whoever arrives while no fsync is running
// issues one for everybody waiting; those arriving during it are covered by
// the next. So one fsync serves all the transactions committed while the
// previous one ran, and no writer holds the write connection through an
// fsync.
//
// What is on disk when a write is answered (the 202 is sent after Update
// returns): its WAL frames were written before the fsync began, and fsync(2)
// returns after every dirty page of the file (of the inode, whichever
// descriptor wrote it) is on stable storage. The WAL header and the
// directory entry were synced by SQLite itself when it wrote the header (it
// syncs the header at synchronous=NORMAL too, and syncs the directory on the
// first sync of a WAL it created), and open syncs the directory once more.
// A checkpoint syncs the WAL before copying frames into the database file
// and syncs that file before the WAL is reused, so a commit already copied
// out is durable in the database file instead. After a power loss SQLite
// recovers the WAL up to the last frame whose cumulative checksum holds,
// that is a prefix of the commits in commit order, which includes every
// commit answered; commits after the last fsync may be lost, and none of
// them was answered. As with synchronous=FULL, this relies on the drive
// honouring flushes and on the VFS's powersafe-overwrite assumption. A
// kill -9 loses nothing written(2), fsynced or not: the kernel has it.
//
// Until its fsync ends a commit is visible to readers that may act on it;
// after a power loss in that window it is gone, as is everything committed
// after it, so the store stays a consistent prefix of what was committed.
//
// An fsync error is kept: after one, Linux may have dropped the dirty pages
// and a later fsync can succeed without them, so no later commit can be
// promised durable either. Every write fails from then on until the
// process restarts and SQLite recovers the WAL from disk (what PostgreSQL
// does on an fsync failure, too).
type groupSync struct {
	path string
	// sync flushes f; (*os.File).Sync unless a test replaces it.
	sync func(f *os.File) error

	mu   sync.Mutex
	cond *sync.Cond
	f    *os.File
	// issued counts the waits begun, synced how many of them the last
	// successful fsync covered; running is set while one is in flight.
	issued, synced uint64
	running        bool
	err            error
	closed         bool
}

// newGroupSync returns the group sync of the WAL at walPath. The file is
// opened at the first sync: SQLite creates it at the first transaction.
func newGroupSync(walPath string) *groupSync {
	g := &groupSync{path: walPath, sync: (*os.File).Sync}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// wait returns once everything committed before it was called is durable,
// or the error of the fsync that should have made it so.
func (g *groupSync) wait() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.issued++
	ticket := g.issued
	for g.running && g.err == nil && g.synced < ticket {
		g.cond.Wait()
	}
	if g.err != nil || g.synced >= ticket {
		return g.err
	}
	// No fsync in flight: this one covers every wait begun so far, each
	// begun after its commit returned.
	g.running = true
	covered := g.issued
	g.mu.Unlock()
	err := g.syncWAL()
	g.mu.Lock()
	g.running = false
	if err != nil {
		g.err = fmt.Errorf("sync write-ahead log %s: %w", g.path, err)
	} else {
		g.synced = covered
	}
	g.cond.Broadcast()
	return g.err
}

// syncWAL fsyncs the WAL file.
func (g *groupSync) syncWAL() error {
	if err := g.open(); err != nil {
		return err
	}
	return g.sync(g.f)
}

// open opens the WAL file unless it is open already, and syncs its
// directory so that its name is durable before a commit in it is promised
// to be. SQLite deletes the WAL only when the last connection to the
// database closes, after checkpointing it into the synced database file;
// if the file at the path is not the one held, that happened, and the new
// one is opened.
func (g *groupSync) open() error {
	now, err := os.Stat(g.path)
	if err != nil {
		return err
	}
	if g.f != nil {
		held, err := g.f.Stat()
		if err != nil {
			return err
		}
		if os.SameFile(held, now) {
			return nil
		}
	}
	f, err := os.Open(g.path)
	if err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(g.path)); err != nil {
		f.Close()
		return err
	}
	if g.f != nil {
		g.f.Close()
	}
	g.f = f
	return nil
}

// close closes the WAL file; waits after it fail.
func (g *groupSync) close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.running {
		g.cond.Wait()
	}
	if g.closed {
		return nil
	}
	g.closed = true
	if g.err == nil {
		g.err = errors.New("store closed")
	}
	if g.f == nil {
		return nil
	}
	return g.f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
