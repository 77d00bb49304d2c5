package proc

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"dbcloud/internal/tenantfs"
)

// LogTail returns what a failed process wrote to its log after offset, for the
// error message: the cause ("could not bind", a bad setting) is there.
func LogTail(path string, offset int64) string {
	// The log lives in a directory the server's OS user can write: a symlink
	// or FIFO put in its place must neither be followed (its target would
	// end up in an error message) nor block the read.
	f, err := tenantfs.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	if fi.Size()-offset > 4096 {
		offset = fi.Size() - 4096
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	data, _ := io.ReadAll(f)
	if len(bytes.TrimSpace(data)) == 0 {
		return ""
	}
	return fmt.Sprintf(" (log %s: %s)", path, strings.TrimSpace(string(data)))
}
