package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/supervise"
	"dbcloud/runtime/local/internal/cgroup"
	"dbcloud/runtime/local/internal/osuser"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/internal/volume"
)

// checkGuard fails when the guard library is not installed for the
// PostgreSQL in binDir: every instance preloads it, and running tenants
// without it would let them reach the host, so dbcloud refuses to start
// rather than start services that would fail or run unguarded.
func checkGuard(binDir string) error {
	libDir := filepath.Join(filepath.Dir(binDir), "lib")
	if out, err := exec.Command(filepath.Join(binDir, "pg_config"), "--pkglibdir").Output(); err == nil {
		libDir = strings.TrimSpace(string(out))
	}
	lib := filepath.Join(libDir, GuardLibrary+".so")
	if fi, err := os.Stat(lib); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("the %s library is not installed (%s missing): run scripts/deps.sh, which builds it from extensions/%s", GuardLibrary, lib, GuardLibrary)
	}
	return nil
}

// pgOSUser is the unprivileged OS user PostgreSQL runs as when dbcloud runs
// as root: initdb and postgres refuse to run as root.
const pgOSUser = "postgres"

const (
	// readyTimeout bounds a start: recovery after a crash can take a while,
	// but a server not accepting connections after this is broken.
	readyTimeout = 30 * time.Second
	// recoveryTimeout bounds a start that recovers a fork, which replays
	// WAL before it accepts connections: up to a day's WAL for PITR.
	recoveryTimeout = time.Hour
	// reloadTimeout bounds how long Reload waits to observe the reload.
	reloadTimeout = 10 * time.Second
	// abortGrace is how long the processes of a postmaster that failed to
	// start may take to exit by themselves (see abort).
	abortGrace = 10 * time.Second
	// defaultStopTimeout is used by Destroy and when Stop gets no bound.
	defaultStopTimeout = 30 * time.Second
	// maxSocketPath is the longest unix socket path Linux accepts
	// (sizeof(sun_path) - 1).
	maxSocketPath = 107
)

// Instances runs the PostgreSQL instances of this host: it prepares data
// directories (from a pool of clusters made ahead of time), starts, adopts,
// stops and reconfigures postmasters, and confines each instance to its own
// cgroups. Instances outlive it: a new Instances adopts postmasters that
// are already running.
type Instances struct {
	// BinDir holds the PostgreSQL binaries (initdb, postgres).
	BinDir string
	// PoolDir is where prepared clusters wait. It must be on the same
	// filesystem as the instance directories, so taking one is a rename.
	PoolDir string
	// PoolSize is how many prepared clusters to keep; 0 disables the pool.
	PoolSize int
	// PoolMaxSize is how many the pool may grow to while creates come
	// faster than it refills (a burst); it shrinks back after poolIdle.
	// Prepared clusters are stopped: each costs about 40 MB of disk (and
	// an OS user, with Identities), no memory.
	PoolMaxSize int
	// PoolMemoryShare bounds the preparations under way at once: each is
	// counted at prepareMemory, and together they stay within this share
	// of MemAvailable (and at one per CPU).
	PoolMemoryShare float64
	// Identities, when set, gives each pool entry an OS identity of its
	// own, made with the entry (see Claim); nil when dbcloud does not run
	// services as identities of their own.
	Identities Identities
	Logger     *slog.Logger

	cred      *syscall.Credential // nil: PostgreSQL runs as the current user
	osUser    string              // the OS user dbcloud runs as, which the ident map names
	sup       *proc.Supervisor
	cgroups   *cgroup.Hierarchy
	exdevWarn sync.Once
	oomWarn   sync.Once
	// volumes, when set, makes each pool entry a volume of its own (see
	// EntryVolumes).
	volumes *volume.Volumes

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per instance Dir

	refill chan struct{} // wakes the pool loop after a take
	poolMu sync.Mutex
	// burstTarget is the pool's target while a burst lasts (0: PoolSize),
	// lastTake when a create last took a cluster.
	burstTarget int
	lastTake    time.Time
	// settling holds, by the directory it went to, when each entry that
	// a create of this process claimed was taken, until its service has
	// served (Settled): the refill holds off meanwhile (settleUntil).
	settling map[string]time.Time
	// waiting counts the creates of this process that found the pool
	// empty and wait for the refill.
	waiting atomic.Int32
	// templateMu makes one template at a time (template.go).
	templateMu sync.Mutex
	// copy is the copy of the template that the pool's entries clone now
	// (template_copies.go), templateFanOut how many take one (0: the
	// default).
	copyMu         sync.Mutex
	copy           *templateCopy
	templateFanOut int
	cancel         context.CancelFunc
	loops          supervise.Group // the pool refill (pool.go)

	// versions holds the Instances of the other PostgreSQL versions by
	// their BinDir (AddVersion), each with its own pool and template.
	versions map[string]*Instances
}

// Defaults of the pool's burst bounds.
const (
	DefaultPoolMaxSize     = 8
	DefaultPoolMemoryShare = 0.1
)

// Identities makes and removes OS identities by key (osuser.Manager).
type Identities interface {
	Ensure(ctx context.Context, key string) (osuser.Identity, error)
	Remove(ctx context.Context, key string) error
}

// Config says where the PostgreSQL binaries and the pool are and what the
// instances share with the rest of the runtime.
type Config struct {
	BinDir   string
	PoolDir  string
	PoolSize int
	// PoolMaxSize (default DefaultPoolMaxSize, at least PoolSize) and
	// PoolMemoryShare (default DefaultPoolMemoryShare) bound the pool's
	// growth in a burst of creates (see Instances).
	PoolMaxSize     int
	PoolMemoryShare float64
	Identities      Identities
	// Volumes, where it enforces limits (btrfs subvolumes with quotas)
	// and with Identities, makes every pool entry a volume of its own,
	// which Claim renames whole to a new service's volume: renames cross
	// no subvolume, so no entry could be taken into a service's volume
	// otherwise (see EntryVolumes).
	Volumes *volume.Volumes
	Logger  *slog.Logger
	// Supervisor starts and reaps the postmasters; Cgroups confines them.
	// Either may be nil for a private one.
	Supervisor *proc.Supervisor
	Cgroups    *cgroup.Hierarchy
}

// NewInstances returns Instances using the PostgreSQL binaries in
// cfg.BinDir and keeping cfg.PoolSize prepared clusters in cfg.PoolDir
// (after Open).
func NewInstances(cfg Config) (*Instances, error) {
	for _, bin := range []string{"postgres", "initdb"} {
		if fi, err := os.Stat(filepath.Join(cfg.BinDir, bin)); err != nil || !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("PostgreSQL binary %s not found in %s (set --pg-bin-dir)", bin, cfg.BinDir)
		}
	}
	if err := checkGuard(cfg.BinDir); err != nil {
		return nil, err
	}
	poolDir, err := filepath.Abs(cfg.PoolDir)
	if err != nil {
		return nil, fmt.Errorf("pool dir: %w", err)
	}
	if cfg.PoolSize < 0 || cfg.PoolMaxSize < 0 || cfg.PoolMemoryShare < 0 || cfg.PoolMemoryShare > 1 {
		return nil, fmt.Errorf("pool size %d and max size %d must not be negative, memory share %v within 0 and 1",
			cfg.PoolSize, cfg.PoolMaxSize, cfg.PoolMemoryShare)
	}
	if cfg.PoolMaxSize == 0 {
		cfg.PoolMaxSize = DefaultPoolMaxSize
	}
	if cfg.PoolMemoryShare == 0 {
		cfg.PoolMemoryShare = DefaultPoolMemoryShare
	}
	// A pool of 0 stays off; otherwise a burst may grow it to at least
	// its size.
	maxSize := 0
	if cfg.PoolSize > 0 {
		maxSize = max(cfg.PoolMaxSize, cfg.PoolSize)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Supervisor == nil {
		cfg.Supervisor = proc.NewSupervisor()
	}
	if cfg.Cgroups == nil {
		cfg.Cgroups = cgroup.NewHierarchy(cfg.Logger)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	var vols *volume.Volumes
	if cfg.Volumes != nil && cfg.Volumes.Enforced() && cfg.Identities != nil {
		vols = cfg.Volumes
	}
	return &Instances{
		BinDir:          cfg.BinDir,
		PoolDir:         poolDir,
		volumes:         vols,
		PoolSize:        cfg.PoolSize,
		PoolMaxSize:     maxSize,
		PoolMemoryShare: cfg.PoolMemoryShare,
		Identities:      cfg.Identities,
		Logger:          cfg.Logger,
		cred:            cred,
		osUser:          CurrentOSUser(),
		sup:             cfg.Supervisor,
		cgroups:         cfg.Cgroups,
		locks:           map[string]*sync.Mutex{},
		refill:          make(chan struct{}, 1),
	}, nil
}

// AddVersion makes v, whose BinDir holds another PostgreSQL version, the
// one that makes the data directories of specs naming its BinDir, from its
// own pool of prepared clusters (a 15 pool and a 17 pool: a cluster is
// its version's). Open, Close and DrainPool of m reach v's pool too. Call
// it before Open.
func (m *Instances) AddVersion(v *Instances) {
	if m.versions == nil {
		m.versions = map[string]*Instances{}
	}
	m.versions[v.BinDir] = v
}

// version is the Instances that makes s's data directory: m, or the one
// of s's other PostgreSQL version.
func (m *Instances) version(s Spec) *Instances { return m.Version(s.BinDir) }

// Version is the Instances of the PostgreSQL version in binDir, whose
// pool a new service of that version claims from (Claim): m for its own
// BinDir and for "".
func (m *Instances) Version(binDir string) *Instances {
	if v, ok := m.versions[binDir]; ok && binDir != m.BinDir {
		return v
	}
	return m
}

// binDir is where the binaries of s's PostgreSQL version are.
func (m *Instances) binDir(s Spec) string {
	if s.BinDir != "" {
		return s.BinDir
	}
	return m.BinDir
}

// LimitsEnforced says whether the instances' CPU and memory limits are
// enforced (by cgroups) on this host, and if not, why.
func (m *Instances) LimitsEnforced() (bool, error) { return m.cgroups.Enforced() }

// Credential is the OS identity the instances run as (nil: dbcloud's own).
func (m *Instances) Credential() *syscall.Credential { return m.cred }

// serverCredential returns the identity PostgreSQL runs as: nil (the
// current user) normally, or the postgres OS user when we are root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(pgOSUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, so PostgreSQL must run as OS user %q, but looking it up failed: %w", pgOSUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse uid %q of %s: %w", u.Uid, pgOSUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse gid %q of %s: %w", u.Gid, pgOSUser, err)
	}
	// No supplementary groups: the server gets its own uid and gid only.
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// Lock serializes the operations on one directory (an instance's, or a
// pooler's that reaches it); call the returned function to unlock.
func (m *Instances) Lock(dir string) func() {
	m.mu.Lock()
	l, ok := m.locks[dir]
	if !ok {
		l = &sync.Mutex{}
		m.locks[dir] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Prepare makes Dir/pgdata if it does not exist, by taking a prepared
// cluster from the pool (a rename, so it is instant) or, if the pool is
// empty, by preparing one now; then it (always) writes the config files in
// Dir/conf atomically. It is idempotent.
func (m *Instances) Prepare(ctx context.Context, s Spec) error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("prepare instance %s: %w", s.ID, err)
	}
	defer m.Lock(s.Dir)()
	if err := m.prepare(ctx, s); err != nil {
		return fmt.Errorf("prepare instance %s: %w", s.ID, err)
	}
	return nil
}

func (m *Instances) prepare(ctx context.Context, s Spec) error {
	if err := m.makeInstanceRoot(s); err != nil {
		return err
	}
	if err := m.checkTraversable(s, s.Dir); err != nil {
		return err
	}
	taken := ""
	if _, err := os.Lstat(s.PGData()); errors.Is(err, fs.ErrNotExist) {
		if taken, err = m.makeDataDir(ctx, s); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	// A cluster from the pool, a fork's copy or a service's data from
	// before it had an identity of its own becomes its OS user's.
	if err := m.ownTree(s, s.PGData()); err != nil {
		return err
	}
	if taken != "" && m.Identities != nil {
		// Its files are the service's now; the identity it was made as
		// goes with the rest of its pool entry.
		if err := m.removeEntry(ctx, taken); err != nil {
			m.Logger.Warn("remove the OS user of a taken pool entry", "entry", taken, "error", err)
		}
	}
	// Left by a crash during an inline preparation that an earlier Prepare
	// did not get to redo (the data directory came from elsewhere since).
	if err := removeWorkDir(filepath.Join(s.Dir, ".prepare")); err != nil {
		return err
	}
	for _, dir := range []string{s.RunDir(), s.LogDir()} {
		if err := m.MakeServerDir(s, dir); err != nil {
			return err
		}
	}
	if s.ArchiveDir != "" {
		if err := m.MakeServerDir(s, s.ArchiveDir); err != nil {
			return err
		}
		if err := m.ownTree(s, s.ArchiveDir); err != nil {
			return err
		}
	}
	return m.writeConfig(s)
}

// makeInstanceRoot makes Dir, which is dbcloud's: traversable by the
// server's OS user (os.MkdirTemp makes 0700) so it reaches the directories
// inside, and, with a service identity, by nobody else.
func (m *Instances) makeInstanceRoot(s Spec) error {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	if s.Owner != nil && m.cred != nil {
		if err := os.Lchown(s.Dir, 0, int(s.Owner.GID)); err != nil {
			return err
		}
		return os.Chmod(s.Dir, 0o750)
	}
	return os.Chmod(s.Dir, 0o755)
}

// makeDataDir puts a fresh cluster at Dir/pgdata: from the pool if it has
// one (it returns the name of the entry taken), else made now.
func (m *Instances) makeDataDir(ctx context.Context, s Spec) (string, error) {
	if v := m.version(s); v != m {
		// initdb of the instance's own version, from its own pool.
		return v.makeDataDir(ctx, s)
	}
	start := time.Now()
	taken, err := m.takeFromPool(ctx, s.PGData())
	if err != nil {
		return "", err
	}
	if taken != "" {
		m.Logger.Info("instance data directory taken from pool", "instance", s.ID, "ms", time.Since(start).Milliseconds())
		return taken, nil
	}
	// Inline: prepare in Dir/.prepare, which shares Dir's filesystem, and
	// rename into place only when complete, so a crash leaves no half-made
	// pgdata (the next Prepare starts over).
	work := filepath.Join(s.Dir, ".prepare")
	if err := removeWorkDir(work); err != nil {
		return "", err
	}
	defer removeWorkDir(work)
	if err := os.Mkdir(work, 0o755); err != nil {
		return "", err
	}
	if err := volume.NoCOWDir(work); err != nil {
		return "", err
	}
	// From the template when there is one; the plane keeping the pool
	// makes it.
	if _, err := m.makeCluster(ctx, work, s.Owner, 0, false); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(work, "pgdata"), s.PGData()); err != nil {
		return "", err
	}
	if err := atomicfile.SyncDir(s.Dir); err != nil {
		return "", err
	}
	m.Logger.Info("instance data directory prepared inline (pool empty)", "instance", s.ID, "ms", time.Since(start).Milliseconds())
	return "", nil
}
