package pglog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"dbcloud"
)

const (
	// firstBlock is the first read of a file; a page of 500 lines of about
	// 460 bytes needs four reads (the size doubles), a rare search larger
	// ones.
	firstBlock = 64 << 10
	maxBlock   = 1 << 20
)

// position is where a source's next older line ends: every line that ends
// at or before Offset in File (and every line of older files) is still to
// be read.
type position struct {
	Node   int
	File   string
	Offset int64
}

// hit is a matching entry and where its line ends.
type hit struct {
	entry Entry
	file  string
	end   int64
}

// sourceIter walks one source's matching entries from newest to oldest, in
// file order, which is what makes (file, offset) a position.
type sourceIter struct {
	src   Source
	f     *filter
	files []logFile
	idx   int // index in files of the file being read
	sc    *backScanner

	block     []byte // lines being looked at; valid until the next block
	base      int64  // file offset of block[0]
	cands     []span // lines of block that passed the byte filters, oldest first
	lastBlock bool   // the block reached below Since: read no further
	done      bool

	head *hit // next entry to return; nil when exhausted
}

// openSource positions a source at start, or at its newest complete line
// when start is nil.
func openSource(s Source, start *position, f *filter) (*sourceIter, error) {
	files, err := listFiles(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("node %d: %w", s.Node, err)
	}
	it := &sourceIter{src: s, f: f, files: files, idx: len(files)}
	if start == nil {
		if err := it.openFile(len(files)-1, -1); err != nil {
			return nil, err
		}
		return it, nil
	}
	i := findFile(files, start.File)
	if i < 0 {
		return nil, errExpired(start.File, s.Node)
	}
	if err := it.openFile(i, start.Offset); err != nil {
		return nil, err
	}
	return it, nil
}

// errExpired says that a cursor's file is gone: retention removes files
// only, and always the oldest, so nothing else deletes one.
func errExpired(file string, node int) error {
	return dbcloud.Errorf(dbcloud.KindInvalid,
		"The cursor has expired: the log file it points into (%s of node %d) was removed by log retention. Read again without a cursor.",
		file, node)
}

// findFile returns the index of the file named name, or -1.
func findFile(files []logFile, name string) int {
	for i := range files {
		if files[i].name == name {
			return i
		}
	}
	return -1
}

// openFile starts reading files[i] backward from end (-1: from its last
// complete line), skipping files that hold only lines newer than Until.
// Files older than i that have gone were removed by retention, which
// removes oldest first, so the source simply ends there.
func (it *sourceIter) openFile(i int, end int64) error {
	it.closeFile()
	for ; i >= 0; i, end = i-1, -1 {
		lf := it.files[i]
		if it.f.until != nil && !lf.opened.IsZero() && !lf.opened.Add(-Slack).Before(*it.f.until) {
			continue // every line is at or after Until
		}
		fh, err := openRegular(filepath.Join(it.src.Dir, lf.name))
		if errors.Is(err, errNotRegular) {
			continue // not a log file the collector wrote: skipped, never read
		} else if errors.Is(err, os.ErrNotExist) {
			if end >= 0 {
				return errExpired(lf.name, it.src.Node)
			}
			break
		} else if err != nil {
			return fmt.Errorf("node %d: open log file: %w", it.src.Node, err)
		}
		fi, err := fh.Stat()
		if err != nil {
			fh.Close()
			return fmt.Errorf("node %d: %w", it.src.Node, err)
		}
		trim := end < 0
		if trim {
			end = fi.Size()
		} else if err := checkLineEnd(fh, end, fi.Size()); err != nil {
			fh.Close()
			return dbcloud.Errorf(dbcloud.KindInvalid,
				"The cursor does not match log file %s of node %d (%v). Read again without a cursor.", lf.name, it.src.Node, err)
		}
		it.idx = i
		it.sc = &backScanner{f: fh, pos: end, size: firstBlock, trim: trim}
		return nil
	}
	it.idx = -1
	it.done = true
	return nil
}

// checkLineEnd checks that a cursor's offset is a line end of the file: a
// signed cursor always is, unless the file was replaced since.
func checkLineEnd(f *os.File, off, size int64) error {
	if off < 0 || off > size {
		return fmt.Errorf("offset %d is outside its %d bytes", off, size)
	}
	if off == 0 {
		return nil
	}
	var b [1]byte
	if _, err := f.ReadAt(b[:], off-1); err != nil {
		return err
	}
	if b[0] != '\n' {
		return fmt.Errorf("offset %d is not the end of a line", off)
	}
	return nil
}

func (it *sourceIter) closeFile() {
	if it.sc != nil {
		it.sc.f.Close()
		it.sc = nil
	}
	it.block, it.cands = nil, nil
}

func (it *sourceIter) close() { it.closeFile() }

// finish ends the source: nothing older matches.
func (it *sourceIter) finish() {
	it.closeFile()
	it.done = true
	it.head = nil
}

// advance sets head to the next older matching entry, or nil.
func (it *sourceIter) advance(ctx context.Context) error {
	it.head = nil
	for !it.done {
		for len(it.cands) > 0 {
			sp := it.cands[len(it.cands)-1]
			it.cands = it.cands[:len(it.cands)-1]
			line := it.block[sp.start:sp.end]
			e, verdict := it.f.match(line)
			switch verdict {
			case tooOld:
				it.finish()
				return nil
			case matched:
				e.Node = it.src.Node
				it.head = &hit{entry: e, file: it.files[it.idx].name, end: it.base + int64(sp.end)}
				return nil
			}
		}
		if it.lastBlock {
			it.finish()
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if it.sc == nil {
			it.finish()
			return nil
		}
		block, base, err := it.sc.next()
		if err != nil {
			return fmt.Errorf("node %d: read log file %s: %w", it.src.Node, it.files[it.idx].name, err)
		}
		if block == nil {
			if err := it.openFile(it.idx-1, -1); err != nil {
				return err
			}
			continue
		}
		it.block, it.base = block, base
		it.cands = it.f.candidates(block, it.cands[:0])
		// Lines before this block are older still than its first one: if
		// that is already below Since, this is the last block to read.
		it.lastBlock = it.f.belowSince(block)
	}
	return nil
}

// backScanner reads a file backward in blocks of whole lines.
type backScanner struct {
	f     *os.File
	pos   int64  // bytes [0, pos) are not read yet
	carry []byte // bytes from pos on that end a line starting before pos
	size  int    // size of the next read; doubles up to maxBlock
	buf   []byte
	// trim drops the bytes after the last newline: a line the collector is
	// still writing. It is read, complete, by a later first page.
	trim bool
}

// next returns the next older run of whole lines, each ending in '\n', and
// the file offset of its first byte; nil at the start of the file. The
// slice is valid until the next call.
func (s *backScanner) next() ([]byte, int64, error) {
	for {
		if s.pos == 0 {
			if len(s.carry) > 0 && !s.trim {
				data := s.carry
				s.carry = nil
				return data, 0, nil // the file's first line
			}
			return nil, 0, nil
		}
		n := int64(s.size)
		if n > s.pos {
			n = s.pos
		}
		if s.size < maxBlock {
			s.size *= 2
		}
		need := int(n) + len(s.carry)
		if cap(s.buf) < need {
			nb := make([]byte, need, need+need/4)
			copy(nb[n:], s.carry)
			s.buf = nb
		} else {
			s.buf = s.buf[:need]
			copy(s.buf[n:], s.carry) // may overlap the carry: copy moves
		}
		s.pos -= n
		if _, err := s.f.ReadAt(s.buf[:n], s.pos); err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("file shrank below offset %d: %w", s.pos+n, err)
			}
			return nil, 0, err
		}
		data, base := s.buf, s.pos
		if s.trim {
			i := bytes.LastIndexByte(data, '\n')
			if i < 0 {
				s.carry = nil // all of it belongs to the unfinished line
				continue
			}
			data = data[:i+1]
			s.trim = false
		}
		if s.pos > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				s.carry = data // the middle of one long line
				continue
			}
			s.carry = data[:i+1]
			data, base = data[i+1:], base+int64(i+1)
		} else {
			s.carry = nil
		}
		if len(data) > 0 {
			return data, base, nil
		}
	}
}
