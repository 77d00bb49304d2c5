package backup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"dbcloud/internal/tenantfs"
)

// Every service archives its WAL into DATA/services/<id>/archive with
// basic_archive, keyed by service id, never by system identifier: a fork
// has its parent's system identifier, so an archive named by it would mix
// the WAL of both.
const archiveDirName = "archive"

// LSN is a PostgreSQL WAL location.
type LSN uint64

// ParseLSN reads PostgreSQL's text form, "16/B374D848".
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, fmt.Errorf("LSN %q: want HI/LO", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	return LSN(h<<32 | l), nil
}

func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint64(l)>>32, uint64(l)&0xFFFFFFFF) }

// walSegment names one WAL segment file: timeline and segment number.
type walSegment struct {
	tli   uint32
	segNo uint64
}

// segmentOf is the segment holding the byte at l (XLByteToSeg).
func segmentOf(tli uint32, l LSN, segSize uint64) walSegment {
	return walSegment{tli: tli, segNo: uint64(l) / segSize}
}

// name is the segment's file name (XLogFileName).
func (s walSegment) name(segSize uint64) string {
	perID := uint64(0x100000000) / segSize
	return fmt.Sprintf("%08X%08X%08X", s.tli, s.segNo/perID, s.segNo%perID)
}

// parseSegmentName reads a WAL segment file name.
func parseSegmentName(name string, segSize uint64) (walSegment, error) {
	if !isSegmentName(name) {
		return walSegment{}, fmt.Errorf("%q is not a WAL segment name", name)
	}
	tli, _ := strconv.ParseUint(name[0:8], 16, 32)
	hi, _ := strconv.ParseUint(name[8:16], 16, 32)
	lo, _ := strconv.ParseUint(name[16:24], 16, 32)
	return walSegment{tli: uint32(tli), segNo: hi*(uint64(0x100000000)/segSize) + lo}, nil
}

// isSegmentName reports whether name is a WAL segment file name: 24
// upper-case hex digits.
func isSegmentName(name string) bool {
	if len(name) != 24 {
		return false
	}
	for _, c := range name {
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// segmentPosition orders WAL files across timelines by the position they
// cover (the name without its timeline), as pg_archivecleanup does; for a
// .partial, .backup or basic_archive temp file it is the position of its
// segment.
func segmentPosition(name string) (string, bool) {
	// basic_archive's temp files, "archtemp.<file>.<pid>.<epoch>", are
	// left behind by a crash mid-copy.
	base := strings.TrimPrefix(name, "archtemp.")
	if i := strings.IndexByte(base, '.'); i >= 0 {
		base = base[:i]
	}
	if !isSegmentName(base) {
		return "", false
	}
	return base[8:], true
}

// WaitArchived waits until the segment file is in the archive: the
// archiver copies segments in order, so every earlier one is there too.
func WaitArchived(ctx context.Context, archiveDir, segment string, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for {
		if fi, err := tenantfs.Lstat(filepath.Join(archiveDir, segment)); err == nil && fi.Mode().IsRegular() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("WAL segment %s not archived into %s within %v: %w", segment, archiveDir, bound, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pruneArchive removes the WAL (segments, partial segments and backup
// history files) that lies before keepFrom, the first segment the oldest
// kept snapshot needs. Timeline history files are kept: they are tiny and
// recovery needs them to follow timelines.
func pruneArchive(archiveDir, keepFrom string) (removed int, err error) {
	keep, ok := segmentPosition(keepFrom)
	if !ok {
		return 0, fmt.Errorf("prune archive: %q is not a WAL segment", keepFrom)
	}
	entries, err := os.ReadDir(archiveDir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pos, ok := segmentPosition(e.Name())
		if !ok || strings.HasSuffix(e.Name(), ".history") || pos >= keep {
			continue
		}
		if err := os.Remove(filepath.Join(archiveDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, err
		}
		removed++
	}
	return removed, nil
}

// ArchivedCommit is the last transaction end found in an archive.
type ArchivedCommit struct {
	Time time.Time
	// LSN is where the commit (or abort) record starts; recovering with
	// recovery_target_lsn at it, inclusive, stops right after it.
	LSN LSN
}

// LastArchivedCommit finds the last commit or abort record in the archive
// at or after segment from, by reading segments newest first with
// pg_waldump. A point-in-time recovery can only stop at such a record, and
// fails ("recovery ended before configured recovery target was reached")
// when none follows the target; so for a stopped service this is the end
// of its recovery window. It returns nil when there is none. binDir holds
// the binaries of the archive's PostgreSQL version (pg_waldump reads only
// its own version's WAL); "" is the binaries Backups was made with.
func (b *Backups) LastArchivedCommit(ctx context.Context, binDir, archiveDir, from string, segSize uint64) (*ArchivedCommit, error) {
	if binDir == "" {
		binDir = b.binDir
	}
	start, ok := segmentPosition(from)
	if !ok {
		return nil, fmt.Errorf("%q is not a WAL segment", from)
	}
	entries, err := os.ReadDir(archiveDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var segs []string
	for _, e := range entries {
		// Only regular files: the archive is the service user's, and a
		// FIFO or link named like a segment is none of the archiver's.
		if e.Type().IsRegular() && isSegmentName(e.Name()) && e.Name()[8:] >= start {
			segs = append(segs, e.Name())
		}
	}
	if len(segs) == 0 {
		return nil, nil
	}
	sort.Slice(segs, func(i, j int) bool {
		if segs[i][8:] != segs[j][8:] {
			return segs[i][8:] < segs[j][8:]
		}
		return segs[i][:8] < segs[j][:8]
	})
	key := archiveDir + "\x00" + from + "\x00" + segs[len(segs)-1]
	// An archive that gained no segment has the same answer.
	b.mu.Lock()
	cached, hit := b.commits[key]
	b.mu.Unlock()
	if hit {
		return cached, nil
	}
	var found *ArchivedCommit
	for i := len(segs) - 1; i >= 0 && found == nil; i-- {
		if found, err = segmentLastCommit(ctx, binDir, archiveDir, segs[i]); err != nil {
			return nil, err
		}
	}
	b.mu.Lock()
	if len(b.commits) >= 1024 {
		clear(b.commits) // answers for archives that changed since
	}
	b.commits[key] = found
	b.mu.Unlock()
	return found, nil
}

// waldumpTimeout bounds one pg_waldump run: a segment takes well under a
// second, and one that is a FIFO would never end.
const waldumpTimeout = 2 * time.Minute

// segmentLastCommit runs pg_waldump over one archived segment and returns
// its last transaction commit or abort. The archive is written by the
// service's OS user, and pg_waldump opens what is there by name (a link to
// a file of root's, a FIFO): it runs as the archive's owner, so it reads
// nothing that user could not, and within waldumpTimeout.
func segmentLastCommit(ctx context.Context, binDir, archiveDir, segment string) (*ArchivedCommit, error) {
	ctx, cancel := context.WithTimeout(ctx, waldumpTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "pg_waldump"), "--path", archiveDir,
		"--rmgr", "Transaction", segment, segment)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C", "TZ=UTC"}
	cmd.Dir = "/"
	cred, err := archiveOwner(archiveDir)
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A segment ends in an unused tail, which pg_waldump reports as an
	// invalid record and a failure; the records before it are what counts.
	runErr := cmd.Run()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if stdout.Len() == 0 && runErr != nil && !bytes.Contains(stderr.Bytes(), []byte("error in WAL record")) &&
		!bytes.Contains(stderr.Bytes(), []byte("could not find a valid record")) {
		return nil, fmt.Errorf("pg_waldump %s: %w: %s", segment, runErr, strings.TrimSpace(stderr.String()))
	}
	var last *ArchivedCommit
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		if c, ok := parseWaldumpCommit(sc.Text()); ok {
			last = &c
		}
	}
	return last, sc.Err()
}

// archiveOwner is the credential to read archiveDir with: its owner's when
// dbcloud runs as root and the directory is a service user's, nil (dbcloud's
// own) otherwise.
func archiveOwner(archiveDir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	fi, err := os.Lstat(archiveDir)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return nil, nil
	}
	return &syscall.Credential{Uid: st.Uid, Gid: st.Gid, Groups: []uint32{}}, nil
}

// parseWaldumpCommit reads a pg_waldump line of a commit or abort record:
// "rmgr: Transaction len (rec/tot): 34/34, tx: 735, lsn: 0/0155A4E8, prev
// 0/0155A4B0, desc: COMMIT 2026-01-02 15:04:05.123456 UTC; ...".
func parseWaldumpCommit(line string) (ArchivedCommit, bool) {
	_, desc, ok := strings.Cut(line, "desc: ")
	if !ok {
		return ArchivedCommit{}, false
	}
	var rest string
	if r, ok := strings.CutPrefix(desc, "COMMIT "); ok {
		rest = r
	} else if r, ok := strings.CutPrefix(desc, "ABORT "); ok {
		rest = r
	} else {
		return ArchivedCommit{}, false
	}
	ts, _, _ := strings.Cut(rest, ";")
	t, err := time.Parse("2006-01-02 15:04:05.999999 MST", strings.TrimSpace(ts))
	if err != nil {
		return ArchivedCommit{}, false
	}
	_, after, ok := strings.Cut(line, "lsn: ")
	if !ok {
		return ArchivedCommit{}, false
	}
	text, _, _ := strings.Cut(after, ",")
	l, err := ParseLSN(text)
	if err != nil {
		return ArchivedCommit{}, false
	}
	return ArchivedCommit{Time: t.UTC(), LSN: l}, true
}

// CopyArchive copies into dst, a new directory owned by owner, the WAL of
// archive from segment from on and every timeline history file, cloned
// where the filesystem can. A fork replays its parent's WAL as its own OS
// user, which cannot read the parent's archive; it replays this copy.
func CopyArchive(ctx context.Context, archive, dst, from string, owner *syscall.Credential) (int, error) {
	if err := os.RemoveAll(dst); err != nil {
		return 0, err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return 0, err
	}
	if err := chownTo(dst, owner); err != nil {
		return 0, err
	}
	entries, err := os.ReadDir(archive)
	if err != nil {
		return 0, err
	}
	var noClone atomic.Bool
	n := 0
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(name, ".") ||
			(name < from && !strings.HasSuffix(name, ".history")) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if _, _, err := copyFile(filepath.Join(archive, name), filepath.Join(dst, name), 0o600, owner, false, &noClone); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // pruned meanwhile
			}
			return n, fmt.Errorf("copy archived %s: %w", name, err)
		}
		n++
	}
	return n, nil
}
