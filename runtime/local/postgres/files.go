package postgres

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"dbcloud/internal/atomicfile"
)

// MakeServerDir creates a directory PostgreSQL writes into, owned by the
// server's OS user and private to it.
func (m *Instances) MakeServerDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return m.Chown(dir)
}

func (m *Instances) Chown(path string) error {
	if m.cred == nil {
		return nil
	}
	return os.Lchown(path, int(m.cred.Uid), int(m.cred.Gid))
}

// checkTraversable fails, naming the directory, when the server's OS user
// cannot reach dir because an ancestor denies it search permission. It does
// not loosen permissions on directories it does not own.
func (m *Instances) checkTraversable(dir string) error {
	return traversable(m.cred, dir)
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
// into Dir/conf, each atomically, owned by the server's OS user (PostgreSQL
// refuses a key others can read).
func (m *Instances) writeConfig(s Spec) error {
	if err := m.MakeServerDir(s.ConfDir()); err != nil {
		return err
	}
	pgConf, hba, ident := RenderConfig(s, m.osUser)
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
		if err := m.WriteServerFile(s.ConfPath(f.name), f.data, f.perm); err != nil {
			return err
		}
	}
	return atomicfile.SyncDir(s.ConfDir())
}

// WriteServerFile replaces path atomically with a file owned by the
// server's OS user, so that PostgreSQL or PgBouncer (which may re-read it
// at any SIGHUP) and a crash see the old or the new content, never a torn
// file. The caller fsyncs the directory.
func (m *Instances) WriteServerFile(path string, data []byte, perm os.FileMode) error {
	opts := []atomicfile.Option{atomicfile.NoDirSync()}
	if m.cred != nil {
		opts = append(opts, atomicfile.Owner(int(m.cred.Uid), int(m.cred.Gid)))
	}
	return atomicfile.Write(path, data, perm, opts...)
}
