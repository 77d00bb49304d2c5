package postgres

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/tenantfs"
)

// Owner is the credential of s's processes and files: its service's OS
// identity, else the Instances' own (nil: dbcloud's user).
func (m *Instances) Owner(s Spec) *syscall.Credential {
	if s.Owner != nil {
		return s.Owner.Credential()
	}
	return m.cred
}

// MakeServerDir creates a directory s's server writes into, owned by its
// OS user and private to it.
func (m *Instances) MakeServerDir(s Spec, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	return m.Chown(s, dir)
}

// Chown gives path to s's OS user.
func (m *Instances) Chown(s Spec, path string) error {
	c := m.Owner(s)
	if c == nil {
		return nil
	}
	return os.Lchown(path, int(c.Uid), int(c.Gid))
}

// makeReadOnlyDir creates a directory dbcloud writes and s's server only
// reads: root's, with the service's group allowed to read, so a tenant
// with a shell as the service's user cannot rewrite the files that decide
// who may log in (pg_hba.conf, pg_ident.conf). Without a service identity
// it is a server directory as before.
func (m *Instances) makeReadOnlyDir(s Spec, dir string) error {
	if s.Owner == nil || m.cred == nil {
		return m.MakeServerDir(s, dir)
	}
	if err := os.Mkdir(dir, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := os.Lchown(dir, 0, int(s.Owner.GID)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o750)
}

// checkTraversable fails, naming the directory, when the server's OS user
// cannot reach dir because an ancestor denies it search permission. It does
// not loosen permissions on directories it does not own.
func (m *Instances) checkTraversable(s Spec, dir string) error {
	return traversable(m.Owner(s), dir)
}

// ServerCanReach reports, as an error naming the obstacle, whether the OS
// user PostgreSQL runs as can reach dir.
func ServerCanReach(dir string) error {
	cred, err := serverCredential()
	if err != nil {
		return err
	}
	return traversable(cred, dir)
}

func traversable(cred *syscall.Credential, dir string) error {
	if cred == nil {
		return nil
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("stat %s: no owner information", p)
		}
		var bit os.FileMode = 0o001
		switch {
		case st.Uid == cred.Uid:
			bit = 0o100
		case st.Gid == cred.Gid:
			bit = 0o010
		}
		if fi.Mode().Perm()&bit == 0 {
			return fmt.Errorf("OS user %q (uid %d) cannot traverse %s (mode %v)", pgOSUser, cred.Uid, p, fi.Mode().Perm())
		}
		if parent := filepath.Dir(p); parent == p {
			return nil
		}
	}
}

// writeConfig writes the instance's config files, TLS certificate and key
// into Dir/conf, each atomically. With a service identity they are root's
// and group-readable by the service (PostgreSQL accepts a key root owns
// with mode 0640), so the server reads but cannot change them; otherwise
// they are the server's OS user's (PostgreSQL refuses a key others can
// read).
func (m *Instances) writeConfig(s Spec) error {
	if err := m.makeReadOnlyDir(s, s.ConfDir()); err != nil {
		return err
	}
	pgConf, hba, ident := RenderConfig(s, m.osUser)
	written := false
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{certFile, s.CertPEM, 0o644},
		{keyFile, s.KeyPEM, 0o600},
		{hbaFile, []byte(hba), 0o600},
		{identFile, []byte(ident), 0o600},
		{confFile, []byte(pgConf), 0o600},
	} {
		// Every start rewrites them (a wake too), and each write is an
		// fsync on the start's path: one already as it would be written
		// is left alone.
		path := s.ConfPath(f.name)
		if m.confFileIs(s, path, f.data, f.perm) {
			continue
		}
		if err := m.writeReadOnlyFile(s, path, f.data, f.perm); err != nil {
			return err
		}
		written = true
	}
	if !written {
		return nil
	}
	return atomicfile.SyncDir(s.ConfDir())
}

// confFileIs reports whether the file at path is what writeReadOnlyFile
// would make of data: a regular file (no link is followed) with that
// content, mode and owner.
func (m *Instances) confFileIs(s Spec, path string, data []byte, perm os.FileMode) bool {
	uid, gid := -1, -1
	if s.Owner != nil && m.cred != nil {
		uid, gid, perm = 0, int(s.Owner.GID), perm|0o040
	} else if c := m.Owner(s); c != nil {
		uid, gid = int(c.Uid), int(c.Gid)
	}
	f, err := tenantfs.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != perm || fi.Size() != int64(len(data)) {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || uid >= 0 && (int(st.Uid) != uid || int(st.Gid) != gid) {
		return false
	}
	got := make([]byte, len(data)+1) // one more: a file grown since the Stat differs
	n, _ := io.ReadFull(f, got)
	return n == len(data) && bytes.Equal(got[:n], data)
}

// writeReadOnlyFile writes a file of a makeReadOnlyDir directory: root's
// and readable by the service's group where WriteServerFile would give it
// to the server's user.
func (m *Instances) writeReadOnlyFile(s Spec, path string, data []byte, perm os.FileMode) error {
	if s.Owner == nil || m.cred == nil {
		return m.WriteServerFile(s, path, data, perm)
	}
	return atomicfile.Write(path, data, perm|0o040, atomicfile.NoDirSync(), atomicfile.Owner(0, int(s.Owner.GID)))
}

// WriteServerFile replaces path atomically with a file owned by s's OS
// user, so that PostgreSQL or PgBouncer (which may re-read it at any
// SIGHUP) and a crash see the old or the new content, never a torn file.
// The caller fsyncs the directory.
func (m *Instances) WriteServerFile(s Spec, path string, data []byte, perm os.FileMode) error {
	opts := []atomicfile.Option{atomicfile.NoDirSync()}
	if c := m.Owner(s); c != nil {
		opts = append(opts, atomicfile.Owner(int(c.Uid), int(c.Gid)))
	}
	return atomicfile.Write(path, data, perm, opts...)
}

// ownTree gives dir and everything in it to s's OS user when dir is not
// already its: a cluster taken from the pool (prepared as the pool's
// user), or one a service had before it got an identity of its own. The
// root goes last, so a crash half-way leaves it foreign and the next
// Prepare finishes the job. Symlinks are re-owned, never followed.
func (m *Instances) ownTree(s Spec, dir string) error {
	c := m.Owner(s)
	if c == nil {
		return nil
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == c.Uid && st.Gid == c.Gid {
		return nil
	}
	// The tree may hold what a tenant put there (a service from before
	// identities, a rewound former primary): each entry is re-owned by
	// descriptor, and no link, whether the entry or a directory on the way,
	// is followed.
	begin := time.Now()
	files, err := tenantfs.ChownTree(dir, int(c.Uid), int(c.Gid))
	if err != nil {
		return fmt.Errorf("give %s to uid %d: %w", dir, c.Uid, err)
	}
	m.Logger.Info("files given to the service's OS user", "instance", s.ID, "dir", dir, "uid", c.Uid,
		"files", files, "ms", time.Since(begin).Milliseconds())
	return nil
}
