package postgres

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// MinFreeBytes is the free space below which an instance is not started:
// recovery writes WAL and a checkpoint at once, and a postmaster that
// cannot fails its start (or PANICs at its first WAL write) over and over.
// 64 MiB holds several WAL segments and the checkpoint.
const MinFreeBytes = 64 << 20

// DiskFullError says an instance was not started for want of space.
type DiskFullError struct {
	Dir       string
	FreeBytes int64
}

func (e *DiskFullError) Error() string {
	return fmt.Sprintf("%s: only %d MiB free, below the %d MiB an instance needs to start", e.Dir, e.FreeBytes>>20, MinFreeBytes>>20)
}

// checkFreeSpace refuses a start on a filesystem without room for it. It
// counts the space an unprivileged user may use (f_bavail): on ext4 the
// blocks reserved for root are dbcloud's, not the instances'.
func checkFreeSpace(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("free space of %s: %w", dir, err)
	}
	free := int64(st.Bavail) * st.Bsize
	if free < MinFreeBytes {
		return &DiskFullError{Dir: dir, FreeBytes: free}
	}
	return nil
}
