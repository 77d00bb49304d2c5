package tenantfs

import (
	"context"
	"net"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// DialUnix connects to the unix socket name beneath d. connect(2) follows
// links: a link put in place of a server's socket would connect root to
// whatever socket it names (another service's server, as its superuser by
// peer identity). The socket is resolved like every name here (no link on
// the way), checked to be a socket, and connected to through its
// descriptor (/proc/self/fd/N), so what was checked is what is reached.
func (d *Dir) DialUnix(ctx context.Context, name string) (net.Conn, error) {
	fd, err := d.openat(name, unix.O_PATH, 0)
	if err != nil {
		return nil, pathError("dial", d.join(name), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, pathError("dial", d.join(name), err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
	case unix.S_IFLNK: // O_PATH|O_NOFOLLOW opens the link itself
		return nil, pathError("dial", d.join(name), ErrSymlink)
	default:
		return nil, pathError("dial", d.join(name), ErrNotSocket)
	}
	var dialer net.Dialer
	return dialer.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

// DialUnix connects to the unix socket at path; see Dir.DialUnix.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	d, err := OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.DialUnix(ctx, filepath.Base(path))
}
