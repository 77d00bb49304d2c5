package proc

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
)

// LogTail returns what a failed process wrote to its log after offset, for the
// error message: the cause ("could not bind", a bad setting) is there.
func LogTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > 4096 {
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
