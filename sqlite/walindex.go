package sqlite

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"syscall"
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
//
// The header is read through a shared read-only mapping of the file, as
// SQLite's own connections read it: a copy of 96 bytes, where a read(2)
// per request cost more than the rest of a cached GET's store work.
type walIndex struct {
	mu  sync.RWMutex
	f   *os.File
	mem []byte // nil once closed
}

// openWALIndex maps the -shm file of the database at path, which exists
// once a connection has opened the database in WAL mode. It stays valid
// while the Store is open: in WAL mode every open connection holds a
// shared lock on the database, so no other process can become the last
// connection, which alone truncates or removes the file.
func openWALIndex(path string) (*walIndex, error) {
	f, err := os.Open(path + "-shm")
	if err != nil {
		return nil, fmt.Errorf("open the WAL index: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() < walIndexHeaderBytes {
		err = fmt.Errorf("%s is %d bytes, shorter than its header", f.Name(), fi.Size())
	}
	var mem []byte
	if err == nil {
		mem, err = syscall.Mmap(int(f.Fd()), 0, walIndexHeaderBytes, syscall.PROT_READ, syscall.MAP_SHARED)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("map the WAL index: %w", err)
	}
	return &walIndex{f: f, mem: mem}, nil
}

// version returns the header's bytes. A read that overlaps a commit's
// write of them differs from both states and only drops the counters
// once too often. ok is false once the index is closed.
func (w *walIndex) version() (string, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.mem == nil {
		return "", false
	}
	return string(w.mem), true
}

// Close unmaps and closes the file; it is safe to call more than once,
// as Store.Close is.
func (w *walIndex) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mem == nil {
		return nil
	}
	err := syscall.Munmap(w.mem)
	w.mem = nil
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// nextVersion reports whether after is the WAL-index header one commit
// after before: SQLite counts commits in the header's iChange (a 32-bit
// integer at byte 8, in the machine's byte order), once per commit, and
// writes the header in two copies, the second first, which readers
// compare to tell a header being written. A checkpoint does not touch the
// header; restarting the WAL rewrites it without counting a commit (a
// writer's own restart is part of its commit).
func nextVersion(before, after string) bool {
	const size = walIndexHeaderBytes / 2
	if len(before) != walIndexHeaderBytes || len(after) != walIndexHeaderBytes ||
		before[:size] != before[size:] || after[:size] != after[size:] {
		return false
	}
	const isInit = 12
	if before[isInit] != 1 || after[isInit] != 1 {
		return false
	}
	change := func(h string) uint32 { return binary.NativeEndian.Uint32([]byte(h[8:12])) }
	return change(after) == change(before)+1
}
