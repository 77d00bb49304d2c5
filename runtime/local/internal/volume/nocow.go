package volume

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// fsNoCOW is FS_NOCOW_FL (what `chattr +C` sets): btrfs writes the file's
// pages where they are instead of to a new place, unless a clone or a
// snapshot shares them.
const fsNoCOW = 0x00800000

// NoCOWDir marks dir, a new directory that a PostgreSQL data directory is
// made in (or is), so that every file made in it from now on is NOCOW on
// btrfs; elsewhere it does nothing.
//
// Why: btrfs writes every rewritten page to a new place, and PostgreSQL
// rewrites its pages all the time (hint bits, vacuum, checkpoints), so a
// loaded table's files end up in tens of thousands of small extents
// (81,000 for 10 GiB), and a clone (FICLONE), hence a fork or a
// snapshot, costs per extent. A NOCOW file is rewritten in place and
// keeps its large extents until a clone shares them: the first write
// after a clone still goes to a new place (so clones stay copies), later
// ones stay. The price is btrfs's data checksums, which NOCOW turns off
// for those files: PostgreSQL's own page checksums (initdb --data-checksums,
// which dbcloud enables) take their place.
func NoCOWDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return err
	}
	if st.Type != magicBtrfs {
		return nil
	}
	return setNoCOW(f, true)
}

// MatchNoCOW gives dst, a new empty file or directory, src's NOCOW flag.
// btrfs refuses a clone (FICLONE, EINVAL) between a NOCOW and a
// copy-on-write file, and a file made in a directory takes the
// directory's flag, so a copy of a tree must carry each entry's flag over
// for its files to clone: clusters made before data directories were
// NOCOW stay copy-on-write, and their forks and snapshots with them. Where
// the filesystem has no such flag (ext4, XFS, tmpfs) both read the same
// and nothing changes.
func MatchNoCOW(dst, src *os.File) error {
	want, err := noCOW(src)
	if err != nil {
		return nil // no flags here: nothing to match
	}
	have, err := noCOW(dst)
	if err != nil || have == want {
		return nil
	}
	return setNoCOW(dst, want)
}

// IsNoCOW reports whether the file or directory at path is NOCOW (false
// where the filesystem has no flags).
func IsNoCOW(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	on, err := noCOW(f)
	if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP) {
		return false, nil
	}
	return on, err
}

func noCOW(f *os.File) (bool, error) {
	flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return false, err
	}
	return flags&fsNoCOW != 0, nil
}

// setNoCOW turns the flag on or off. btrfs changes it only on a
// directory or an empty file (a file with data keeps what it has, with
// no error), so callers set it before writing.
func setNoCOW(f *os.File, on bool) error {
	flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return err
	}
	if on {
		flags |= fsNoCOW
	} else {
		flags &^= fsNoCOW
	}
	return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags)
}
