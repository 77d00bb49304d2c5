package sqlite

import (
	"fmt"
	"os"
	"sync"
)

// walIndexHeaderBytes is the size of the two copies of the WAL-index
// header at the start of the -shm file (https://sqlite.org/walformat.html,
// "The WAL-Index Header"): among them the change counter, the last commit
// frame and the WAL's salts, of which a commit always moves one.
const walIndexHeaderBytes = 2 * 48

// walIndex reads the WAL-index header of a database, which SQLite writes
// as the last step of every commit from any connection of any process:
// a new read finds the commit through this header. So while the header
// reads the same, nothing was committed that a read would see, and the
// change counters the Store keeps in memory still hold, without a query.
type walIndex struct {
	f         *os.File
	closeOnce sync.Once
	closeErr  error
}

// openWALIndex opens the -shm file of the database at path, which exists
// once a connection has opened the database in WAL mode. It stays valid
// while the Store is open: in WAL mode every open connection holds a
// shared lock on the database, so no other process (the last to close,
// which deletes the file) can remove it meanwhile.
func openWALIndex(path string) (*walIndex, error) {
	f, err := os.Open(path + "-shm")
	if err != nil {
		return nil, fmt.Errorf("open the WAL index: %w", err)
	}
	return &walIndex{f: f}, nil
}

// version returns the header's bytes. A read that overlaps a commit's
// write of them differs from both states and only drops the counters
// once too often. ok is false if the header cannot be read.
func (w *walIndex) version() (string, bool) {
	var b [walIndexHeaderBytes]byte
	if n, _ := w.f.ReadAt(b[:], 0); n != len(b) {
		return "", false
	}
	return string(b[:]), true
}

// Close closes the file; it is safe to call more than once, as Store.Close.
func (w *walIndex) Close() error {
	w.closeOnce.Do(func() { w.closeErr = w.f.Close() })
	return w.closeErr
}
