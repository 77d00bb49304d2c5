package postgres

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"

	"dbcloud/runtime/local/internal/cgroup"
	"dbcloud/runtime/local/internal/osuser"
)

// Spec says everything instance-specific. All of it lives outside
// the data directory (config_file, hba_file and ident_file are given on the
// postgres command line) because copies and pg_rewind overwrite what is
// inside.
type Spec struct {
	// ID is unique on the host, e.g. "<serviceID>-0"; it names the cgroup
	// and the cluster (cluster_name, shown in ps).
	ID string
	// Dir is the instance root (absolute): Dir/pgdata (data directory),
	// Dir/run (unix socket), Dir/log (server logs) and Dir/conf
	// (postgresql.conf, pg_hba.conf, pg_ident.conf, server.crt, server.key).
	Dir string
	// BinDir holds the binaries of the instance's PostgreSQL version; ""
	// is the Instances' BinDir. Another version's data directory is made
	// by that version's Instances (AddVersion), from its own pool.
	BinDir string
	// ListenAddr is listen_addresses, e.g. "127.0.0.1".
	ListenAddr string
	Port       int
	// Settings are GUCs from the service size (shared_buffers,
	// max_connections, work_mem, ...). Settings dbcloud owns (port, ssl,
	// logging, ...) are rejected.
	Settings map[string]string
	// CertPEM and KeyPEM are the TLS server certificate and key (ssl=on).
	CertPEM, KeyPEM []byte
	// CPUMillis is the cgroup CPU quota; 0 means no limit.
	CPUMillis int
	// CPUShares is the cgroup CPU weight (v1 units, 1024 a core); 0
	// follows CPUMillis.
	CPUShares int
	// MemoryBytes is the cgroup memory limit; 0 means no limit.
	MemoryBytes int64
	// ArchiveDir, when set, is where the instance archives its WAL
	// (basic_archive): the service's archive, shared by its instances,
	// since only the primary archives. Prepare creates it.
	ArchiveDir string
	// RestoreFromArchive makes a standby fetch from ArchiveDir the WAL that
	// streaming cannot give it: a rewound former primary replays from
	// before the failover, WAL the new primary may have recycled already.
	RestoreFromArchive bool
	// Owner is the OS identity of the instance's service: its processes
	// run as it and its files belong to it, so a tenant who reaches a
	// shell is that user and no other service's. Nil is the Instances'
	// own identity (the postgres OS user when dbcloud is root), which only
	// the pool's clusters and tests use.
	Owner *osuser.Identity
	// RecoverySettings are passed on the postgres command line, never
	// written to a file, by the one start that recovers a fork: they
	// vanish with that postmaster instead of lingering in the config.
	RecoverySettings map[string]string
	// Sealed renders a pg_hba.conf that lets in nobody over TCP, only
	// dbcloud and the server's own processes over the unix socket: a
	// fork's first start, when its roles still have its parent's
	// passwords. The next Prepare or Reload without it opens it (a reload,
	// no restart: pg_hba.conf is read again on SIGHUP).
	Sealed bool
}

func (s Spec) PGData() string { return filepath.Join(s.Dir, "pgdata") }

func (s Spec) RunDir() string { return filepath.Join(s.Dir, "run") }

func (s Spec) LogDir() string { return filepath.Join(s.Dir, "log") }

func (s Spec) ConfDir() string { return filepath.Join(s.Dir, "conf") }

func (s Spec) ConfPath(name string) string { return filepath.Join(s.ConfDir(), name) }

// instanceID is what may appear in a cgroup path and in cluster_name.
var instanceID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

func (s Spec) validate() error {
	switch {
	case !instanceID.MatchString(s.ID):
		return fmt.Errorf("instance id %q: want 1-63 letters, digits, '_', '.' or '-'", s.ID)
	case !filepath.IsAbs(s.Dir) || filepath.Clean(s.Dir) != s.Dir:
		return fmt.Errorf("instance dir %q must be a clean absolute path", s.Dir)
	case len(filepath.Join(s.RunDir(), ".s.PGSQL.65535")) > maxSocketPath:
		return fmt.Errorf("instance dir %q is too long for a unix socket path (%d bytes max)", s.Dir, maxSocketPath)
	case s.Port < 1 || s.Port > 65535:
		return fmt.Errorf("port %d out of range", s.Port)
	case len(s.CertPEM) == 0 || len(s.KeyPEM) == 0:
		return errors.New("a TLS certificate and key are required (ssl=on)")
	case s.CPUMillis < 0 || s.MemoryBytes < 0:
		return errors.New("limits must not be negative")
	case s.ArchiveDir != "" && (!filepath.IsAbs(s.ArchiveDir) || filepath.Clean(s.ArchiveDir) != s.ArchiveDir):
		return fmt.Errorf("archive dir %q must be a clean absolute path", s.ArchiveDir)
	}
	for k := range s.RecoverySettings {
		if !settingName.MatchString(k) {
			return fmt.Errorf("recovery setting %q is not a valid parameter name", k)
		}
	}
	return validateSettings(s.Settings)
}

// ValidID reports whether id may name an instance (or a pooler): it
// appears in cgroup paths and in cluster_name.
func ValidID(id string) bool { return instanceID.MatchString(id) }

// limits are the spec's cgroup limits.
func (s Spec) limits() cgroup.Limits {
	return cgroup.Limits{CPUMillis: s.CPUMillis, CPUShares: s.CPUShares, MemoryBytes: s.MemoryBytes}
}
