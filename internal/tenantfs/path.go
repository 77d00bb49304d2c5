package tenantfs

import (
	"io/fs"
	"os"
	"path/filepath"
)

// The functions below take a whole path: its directory is opened (the last
// component must not be a link) and the last element resolved beneath it,
// for callers that touch one file once.

// Open opens the regular file at path for reading.
func Open(path string) (*os.File, error) {
	return OpenFile(path, os.O_RDONLY, 0)
}

// OpenFile opens the regular file at path; see Dir.OpenFile.
func OpenFile(path string, flag int, perm fs.FileMode) (*os.File, error) {
	d, err := OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.OpenFile(filepath.Base(path), flag, perm)
}

// ReadFile returns the contents of the regular file at path, at most
// MaxReadFile bytes.
func ReadFile(path string) ([]byte, error) {
	d, err := OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.ReadFile(filepath.Base(path))
}

// Lstat describes the entry at path without following it.
func Lstat(path string) (fs.FileInfo, error) {
	d, err := OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Lstat(filepath.Base(path))
}

// ChownTree gives the directory at path and everything beneath it to uid
// and gid, following no link; see Dir.ChownTree.
func ChownTree(path string, uid, gid int) (int, error) {
	d, err := OpenDir(path)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	return d.ChownTree(uid, gid)
}

// ReadDir describes the entries of the directory at path (which must not
// be a link), links described, not followed.
func ReadDir(path string) ([]fs.FileInfo, error) {
	d, err := OpenDir(path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.ReadDir()
}
