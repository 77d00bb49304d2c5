// Package pgbouncer runs the connection pooler: one PgBouncer per service (runtime-notes.md
// section 8), in transaction mode, on its own port of the endpoint host,
// with TLS and the service's certificate. Clients sign in with SCRAM
// against the service's own role verifiers, which PgBouncer reads through a
// lookup function (auth_query); it then logs in to PostgreSQL as the client
// over the instance's unix socket by SCRAM pass-through, so PostgreSQL
// checks the real credentials a second time and a password change works at
// once. PgBouncer's own lookup role logs in by peer identity over that
// socket: no secret is stored anywhere. The lookup runs in dbcloud's own
// database (postgres.PoolerDatabase, PgBouncer's auth_dbname), never in the
// one the client names, which a tenant may have made.
package pgbouncer

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"dbcloud/runtime/local/internal/cgroup"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"
)

const (
	// poolerMaxClientConn is how many client connections one pooler takes;
	// server connections stay under the service's max_connections.
	poolerMaxClientConn = 2000
	// poolerNoFile is the open-file limit PgBouncer gets (clients, server
	// connections, listeners), capped by the hard limit.
	poolerNoFile = 8192
	// poolerMemoryBytes caps the pooler's cgroup: PgBouncer needs a few MB
	// plus buffers for busy connections.
	poolerMemoryBytes = 256 << 20
	// poolerReadyTimeout bounds a start until the port serves TLS.
	poolerReadyTimeout = 15 * time.Second
	// poolerStopTimeout bounds a stop: a safe shutdown (SIGINT) lets
	// running transactions finish, then SIGTERM, then SIGKILL.
	poolerStopTimeout = 10 * time.Second
	// superuserReserved is PostgreSQL's superuser_reserved_connections,
	// which dbcloud leaves at its default.
	superuserReserved = 3
)

// Files in a service's pooler directory, DATA/services/<id>/pooler.
const (
	poolerIniFile   = "pgbouncer.ini"
	poolerHBAFile   = "pg_hba.conf"
	poolerUsersFile = "userlist.txt"
	poolerCertFile  = "server.crt"
	poolerKeyFile   = "server.key"
	poolerPidFile   = "pgbouncer.pid"
	poolerLogFile   = "pgbouncer.log"
)

// reloadTimeout bounds how long a reload waits to see PgBouncer take it.
const reloadTimeout = 10 * time.Second

// ErrNotInstalled says PgBouncer is not on this host; ErrInvalidSpec, that
// a spec cannot be rendered into a config (retrying will not help).
var (
	ErrNotInstalled = errors.New("PgBouncer is not installed")
	ErrInvalidSpec  = errors.New("invalid pooler spec")
)

// Spec says everything about one pooler.
type Spec struct {
	// ID names the cgroup: "<service>-pooler".
	ID string
	// Dir holds the config, TLS files, pid file and log (absolute).
	Dir        string
	ListenAddr string
	Port       int
	// Host is the endpoint host clients use: the readiness probe dials it
	// and verifies the certificate against it.
	Host string
	// Target is the instance pooled: its unix socket directory and port,
	// its settings (the pool size follows max_connections) and the TLS
	// key pair the pooler presents.
	Target postgres.Spec

	// binary is the PgBouncer that runs it, set by Poolers: part of the
	// restart signature.
	binary string
}

func (p Spec) path(name string) string { return filepath.Join(p.Dir, name) }

func (p Spec) validate() error {
	// PgBouncer's ini and connection-string syntax has no quoting for these.
	for _, v := range []string{p.Dir, p.Target.RunDir(), p.ListenAddr} {
		if v == "" || strings.ContainsAny(v, " \t\r\n'\"\\;#=") {
			return fmt.Errorf("%q cannot appear in a PgBouncer config", v)
		}
	}
	switch {
	case !filepath.IsAbs(p.Dir) || filepath.Clean(p.Dir) != p.Dir:
		return fmt.Errorf("pooler dir %q must be a clean absolute path", p.Dir)
	case !postgres.ValidID(p.ID):
		return fmt.Errorf("pooler id %q is not a valid id", p.ID)
	case p.Port < 1 || p.Port > 65535:
		return fmt.Errorf("pooler port %d out of range", p.Port)
	case p.Target.Port < 1 || p.Target.Port > 65535:
		return fmt.Errorf("target port %d out of range", p.Target.Port)
	case len(p.Target.CertPEM) == 0 || len(p.Target.KeyPEM) == 0:
		return errors.New("a TLS certificate and key are required")
	}
	return nil
}

// Poolers runs the PgBouncers of this host.
type Poolers struct {
	instances *postgres.Instances
	sup       *proc.Supervisor
	cgroups   *cgroup.Hierarchy
	roots     *x509.CertPool
	logger    *slog.Logger
	binary    string // "" when no usable PgBouncer is installed
}

// Config is what Poolers share with the rest of the runtime.
type Config struct {
	// Instances reach the pooled instances (the lookup function is
	// installed over their unix sockets) and own the files PgBouncer runs
	// with, as the server's OS user.
	Instances  *postgres.Instances
	Supervisor *proc.Supervisor
	Cgroups    *cgroup.Hierarchy
	// Roots verify the pooler's certificate in the readiness probe.
	Roots  *x509.CertPool
	Logger *slog.Logger
	// Binary is PgBouncer (a path, or a name looked up on PATH); empty
	// finds DefaultBinary, else Debian's /usr/sbin/pgbouncer, else
	// pgbouncer on PATH, whichever is first to be MinMajor.MinMinor or newer.
	Binary string
}

// DefaultBinary is the PgBouncer scripts/pgbouncer.sh builds (a link to
// the pinned version's prefix).
const DefaultBinary = "/usr/local/lib/dbcloud/pgbouncer/bin/pgbouncer"

// MinMajor.MinMinor is the oldest PgBouncer dbcloud runs: 1.19 added
// auth_dbname, without which the lookup runs in the client's database
// (Debian 12 ships 1.18).
const (
	MinMajor = 1
	MinMinor = 19
)

// New returns Poolers; PgBouncer is looked up once, here. Without a usable
// one (missing, or older than MinMajor.MinMinor) the reason is logged, poolers are
// unavailable and none starts.
func New(cfg Config) *Poolers {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ps := &Poolers{instances: cfg.Instances, sup: cfg.Supervisor, cgroups: cfg.Cgroups, roots: cfg.Roots, logger: cfg.Logger}
	candidates := []string{cfg.Binary}
	if cfg.Binary == "" {
		candidates = []string{DefaultBinary, "/usr/sbin/pgbouncer", "pgbouncer"}
	}
	var errs []error
	for _, c := range candidates {
		bin, version, err := CheckBinary(c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ps.binary = bin
		ps.logger.Info("pooler binary", "path", bin, "version", version)
		return ps
	}
	ps.logger.Error("no usable PgBouncer: connection poolers are refused; scripts/deps.sh builds one",
		"error", errors.Join(errs...))
	return ps
}

// CheckBinary resolves PgBouncer at path (or a name on PATH) to the real
// file it runs, and returns it with its version when that is
// MinMajor.MinMinor or newer.
func CheckBinary(path string) (resolved, version string, err error) {
	bin, err := exec.LookPath(path)
	if err != nil {
		return "", "", fmt.Errorf("pgbouncer %s: %w", path, err)
	}
	// The real path: it names the version (scripts/pgbouncer.sh installs
	// each in a prefix of its own), so a new one restarts the poolers.
	if bin, err = filepath.EvalSymlinks(bin); err != nil {
		return "", "", fmt.Errorf("pgbouncer %s: %w", path, err)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", "", fmt.Errorf("pgbouncer %s --version: %w", bin, err)
	}
	version, ok := parseVersion(string(out))
	if !ok {
		return "", "", fmt.Errorf("pgbouncer %s: cannot read its version from %q", bin, firstLine(string(out)))
	}
	if !atLeast(version, MinMajor, MinMinor) {
		return "", "", fmt.Errorf("pgbouncer %s is version %s, older than %d.%d: it has no auth_dbname, so its sign-in lookup would run in the client's database",
			bin, version, MinMajor, MinMinor)
	}
	return bin, version, nil
}

// parseVersion reads "PgBouncer 1.24.1" from the first line of --version.
func parseVersion(out string) (string, bool) {
	f := strings.Fields(firstLine(out))
	if len(f) < 2 || f[0] != "PgBouncer" {
		return "", false
	}
	return f[1], true
}

// atLeast reports whether a version like 1.24.1 (or 1.25.0rc1) is
// major.minor or newer.
func atLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	var got [2]int
	for i := range got {
		digits := parts[i]
		if end := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); end >= 0 {
			digits = digits[:end]
		}
		n, err := strconv.Atoi(digits)
		if err != nil {
			return false
		}
		got[i] = n
	}
	return got[0] > major || got[0] == major && got[1] >= minor
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// Binary is the PgBouncer poolers run (its real path), "" when none is
// usable.
func (ps *Poolers) Binary() string { return ps.binary }

// Available reports whether a PgBouncer of MinMajor.MinMinor or newer is
// installed.
func (ps *Poolers) Available() bool { return ps.binary != "" }

// Ensure makes the pooler of p run and serve TLS on its port: it writes
// its files, installs the lookup role, database and function on source
// (the primary: the instance pooled itself, or the primary a pooled
// standby replicates from, which it then waits for), starts PgBouncer (or
// adopts the one already running, reloading it when its config changed
// and restarting it when a startup-only setting or the binary did) and
// waits until the port serves TLS with the target's certificate.
func (ps *Poolers) Ensure(ctx context.Context, p Spec, source postgres.Spec) error {
	if ps.binary == "" {
		return ErrNotInstalled
	}
	if err := p.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	p.binary = ps.binary
	defer ps.instances.Lock(p.Dir)()
	if err := ps.ensureAuth(ctx, source); err != nil {
		return err
	}
	if p.Target.ID != source.ID {
		if err := ps.awaitLookup(ctx, p.Target); err != nil {
			return err
		}
	}
	pid, err := ps.run(ctx, p)
	if err != nil {
		return err
	}
	return ps.wait(ctx, p, pid)
}

// PID returns the PID of the pooler whose files are in dir, if it runs.
func (ps *Poolers) PID(dir string) (int, bool) {
	return ps.pid(Spec{Dir: dir})
}

// Stop stops the pooler with this id and dir by PID (a safe shutdown, then
// harder) and removes its files and cgroup. It is idempotent.
func (ps *Poolers) Stop(ctx context.Context, id, dir string) error {
	p := Spec{ID: id, Dir: dir}
	cg := ps.cgroups.Existing(p.ID)
	if _, err := os.Lstat(p.Dir); errors.Is(err, fs.ErrNotExist) && cg == nil {
		return nil // nothing was ever started, or it is gone already
	}
	defer ps.instances.Lock(p.Dir)()
	if err := ps.kill(ctx, p, cg); err != nil {
		return err
	}
	if cg != nil {
		if err := cg.Remove(time.Now().Add(5 * time.Second)); err != nil {
			return err
		}
	}
	return os.RemoveAll(p.Dir)
}
