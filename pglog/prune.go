package pglog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Prune deletes the oldest log files of dir beyond a retention bound and
// returns how many it deleted.
//
// The bound keeps at least maxAge of logs or at least maxBytes of them,
// whichever is less: a file goes when all of its lines are older than
// maxAge (its last write is), or when the newer files already hold
// maxBytes. So an instance that logs little keeps maxAge of history, one
// that logs a lot keeps the newest maxBytes, and the disk used stays under
// maxBytes plus one file (log_rotation_size). A bound of 0 or less is not
// applied.
//
// Files are deleted oldest first and the first file that stays stops the
// pruning, so what remains is always a run of the newest files: a cursor
// whose file is gone then knows all older files are gone too. The newest
// file is never deleted; the logging collector may be writing it.
func Prune(dir string, maxAge time.Duration, maxBytes int64, now time.Time) (removed int, err error) {
	files, err := listFiles(dir)
	if err != nil {
		return 0, err
	}
	type stat struct {
		name  string
		size  int64
		mtime time.Time
	}
	stats := make([]stat, 0, len(files))
	var total int64
	for _, f := range files {
		fi, err := os.Lstat(filepath.Join(dir, f.name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			return 0, fmt.Errorf("prune logs: %w", err)
		}
		if !fi.Mode().IsRegular() {
			continue // never counted, never removed: not the collector's file
		}
		stats = append(stats, stat{f.name, fi.Size(), fi.ModTime()})
		total += fi.Size()
	}
	newer := total // bytes in files newer than stats[i], updated as i moves
	for i := 0; i < len(stats)-1; i++ {
		s := stats[i]
		newer -= s.size
		old := maxAge > 0 && now.Sub(s.mtime) > maxAge
		over := maxBytes > 0 && newer >= maxBytes
		if !old && !over {
			break
		}
		if err := os.Remove(filepath.Join(dir, s.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("prune logs: %w", err)
		}
		removed++
	}
	return removed, nil
}
