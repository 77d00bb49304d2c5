package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	stdhttp "net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"dbcloud/cloud"
	"dbcloud/sizing"

	"dbcloud"
	"dbcloud/console"
	"dbcloud/engine"
	"dbcloud/http"
	"dbcloud/network/loopback"
	"dbcloud/oauth"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/pgbin"
	"dbcloud/internal/supervise"
	"dbcloud/runtime/local"
	"dbcloud/runtime/local/pgbouncer"
	"dbcloud/runtime/local/postgres"
	"dbcloud/tlsca"
)

// Config is everything `dbcloud serve` can be told.
type Config struct {
	DataDir    string
	Listen     string
	Store      string
	TLSCert    string
	TLSKey     string
	PublicHost string
	PGBinDir   string
	Regions    string
	Sizes      string
	PortMin    int
	PortMax    int
	RateLimit  float64
	RateBurst  int
	// MaxStreams caps the event streams one credential holds at once.
	MaxStreams int
	AdminName  string
	AdminEmail string
	LogFormat  string
	Quotas     cloud.Quotas
	PoolSize   int
	// PoolMaxSize and PoolMemoryShare bound the pool's growth in a burst
	// of creates (runtime/local/postgres.Instances).
	PoolMaxSize     int
	PoolMemoryShare float64
	Overcommit      float64
	NodeID          string
	RuntimeDir      string
	// LeaseTTL is how long a plane's lease on a resource outlives its last
	// renewal: the takeover time when a plane dies (docs/multi-plane.md).
	LeaseTTL time.Duration
	// IdleUnit is how long one second of a service's auto-pause
	// idle_seconds lasts: a second, shorter only for tests.
	IdleUnit time.Duration
	// CADir holds the CA that issues every service's certificate; empty
	// is DATA_DIR/tls. Control planes of one installation share it.
	CADir string
	// VPCBlock is where VPC endpoint addresses come from, inside 127.0.0.0/8.
	VPCBlock netip.Prefix
	// SnapshotInterval and SnapshotRetention schedule base backups.
	SnapshotInterval  time.Duration
	SnapshotRetention time.Duration
	// LogMaxAge and LogMaxBytes bound each instance's PostgreSQL logs.
	LogMaxAge   time.Duration
	LogMaxBytes int64
	// PgBouncer is the PgBouncer binary; empty finds dbcloud's own build
	// (pgbouncer.DefaultBinary), else one of MinMajor.MinMinor or newer.
	PgBouncer string
	// StorageLimits size what each service may keep on disk.
	StorageLimits sizing.StorageLimits
	// RestoreCheckInterval is the least time between two verified restores
	// of a service; 0 turns them off.
	RestoreCheckInterval time.Duration
	// StorageImageGiB, above 0, keeps the runtime directory on a btrfs
	// image of that size; local.StorageImageAuto (the default) on one
	// sized from the host's free disk where the directory's filesystem has
	// no quotas; 0 on the host's filesystem.
	StorageImageGiB int
	// HTTP bounds what one client can hold of the API server.
	HTTP http.ServerConfig
	// Metrics: the Prometheus listener and the history's retention.
	Metrics MetricsConfig
	// Runtime is where services run: "local" or "kubernetes" (kube.go).
	Runtime string
	Kube    KubeConfig
}

// crashAfterCommitEnv, set to 1, makes the server kill itself after the
// first change made by a request with an Idempotency-Key, before its
// response: a hook for the crash tests, never for production.
const crashAfterCommitEnv = "DBCLOUD_TEST_CRASH_AFTER_COMMIT"

// DefaultConfig returns the embedded defaults: SQLite and PostgreSQL
// processes on this host, HTTPS with a generated local CA.
func DefaultConfig() Config {
	d := cloud.DefaultConfig()
	h := http.DefaultConfig()
	return Config{
		DataDir: "./dbcloud-data", Listen: "127.0.0.1:8443", PublicHost: d.PublicHost,
		PGBinDir: pgbin.Dir(), Regions: strings.Join(d.Regions, ","), Sizes: sizesString(d.Sizes),
		PortMin: d.PortMin, PortMax: d.PortMax, RateLimit: h.RateLimit, RateBurst: h.RateBurst, MaxStreams: h.MaxStreamsPerCredential,
		AdminName: "admin", AdminEmail: "admin@example.com", LogFormat: "json", Quotas: d.Quotas,
		PoolSize: 2, PoolMaxSize: postgres.DefaultPoolMaxSize, PoolMemoryShare: postgres.DefaultPoolMemoryShare, Overcommit: 4, VPCBlock: netip.MustParsePrefix("127.77.0.0/16"),
		SnapshotInterval: local.DefaultSnapshotInterval, SnapshotRetention: local.DefaultSnapshotRetention,
		StorageLimits: sizing.DefaultStorageLimits, LogMaxAge: 7 * 24 * time.Hour, LogMaxBytes: 1 << 30, HTTP: http.DefaultServerConfig(),
		LeaseTTL: engine.DefaultLeaseTTL, Metrics: DefaultMetricsConfig(), RestoreCheckInterval: time.Hour,
		StorageImageGiB: local.StorageImageAuto,
	}
}

func sizesString(t dbcloud.SizeTable) string {
	parts := make([]string, len(t))
	for i, s := range t {
		parts[i] = s.String()
	}
	return strings.Join(parts, ",")
}

// Main is a running server. Tests run it in-process on a free port.
type Main struct {
	Config Config
	Logger *slog.Logger

	stderr   io.Writer
	store    dbcloud.Store
	cloud    *cloud.Cloud
	server   *stdhttp.Server
	listener net.Listener
	runtime  *local.Runtime
	engine   *engine.Engine
	ca       *tlsca.CA
	cancel   context.CancelFunc
	// background runs the servers and the purge loop (goLoop); Close
	// waits for it.
	background supervise.Group
	// metricsServer serves /metrics on metricsListener (--metrics-listen).
	metricsServer   *stdhttp.Server
	metricsListener net.Listener
	// CAFile is the CA clients must trust; empty with --tls-cert.
	CAFile string
}

// NewMain returns a Main with the default configuration.
func NewMain(stderr io.Writer) *Main {
	return &Main{Config: DefaultConfig(), stderr: stderr}
}

const serveSynopsis = `Serve the dbcloud API over HTTPS.

Several control planes (serve processes on this host) can run one
installation: give them one --store (PostgreSQL), one --runtime-dir and one
--ca-dir, the same port range and schedules, and each its own --data-dir,
--listen and --node-id. Work a plane held moves to another within about
--lease-ttl after it dies. See docs/multi-plane.md.`

// ParseFlags reads the serve flags and their environment variables.
func (m *Main) ParseFlags(args []string) error {
	c := &m.Config
	fs := newFlagSet("dbcloud serve", serveSynopsis, m.stderr)
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the SQLite store, TLS files, bootstrap.json and service data")
	fs.StringVar(&c.Listen, "listen", c.Listen, "address the HTTPS API listens on")
	fs.StringVar(&c.Store, "store", c.Store, "store: empty for SQLite in the data directory, or a postgres:// URL")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM certificate for HTTPS; empty to use a local CA generated into DATA_DIR/tls")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM private key of --tls-cert")
	fs.StringVar(&c.PublicHost, "public-host", c.PublicHost, "host name put into service endpoints")
	fs.StringVar(&c.PGBinDir, "pg-bin-dir", c.PGBinDir, "directory of the PostgreSQL server binaries")
	fs.StringVar(&c.Regions, "regions", c.Regions, "comma-separated region codes; the first is the default")
	fs.StringVar(&c.Sizes, "sizes", c.Sizes, "comma-separated allowed CPU_MILLIS/MEMORY_GBS pairs")
	fs.IntVar(&c.PortMin, "port-min", c.PortMin, "lowest port for service endpoints")
	fs.IntVar(&c.PortMax, "port-max", c.PortMax, "highest port for service endpoints")
	fs.Float64Var(&c.RateLimit, "rate-limit", c.RateLimit, "requests per second per API key (0 disables)")
	fs.IntVar(&c.RateBurst, "rate-burst", c.RateBurst, "burst of requests per API key")
	fs.StringVar(&c.AdminName, "admin-name", c.AdminName, "name of the admin user created with the store")
	fs.StringVar(&c.AdminEmail, "admin-email", c.AdminEmail, "e-mail of the admin user created with the store")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: json or text")
	fs.IntVar(&c.PoolSize, "pool-size", c.PoolSize, "prepared PostgreSQL clusters kept ready for creates")
	fs.IntVar(&c.PoolMaxSize, "pool-max-size", c.PoolMaxSize, "prepared clusters the pool may grow to while creates come faster than it refills (stopped clusters: about 40 MB of disk and an OS user each); it shrinks back to --pool-size after 2 minutes without creates")
	fs.Float64Var(&c.PoolMemoryShare, "pool-memory-share", c.PoolMemoryShare, "share of MemAvailable the pool's preparations under way may use together, each counted at 64 MiB (and at most one per CPU)")
	fs.Float64Var(&c.Overcommit, "overcommit", c.Overcommit, "how many times the host's CPU and memory all running instances may reserve together")
	fs.DurationVar(&c.HTTP.ReadTimeout, "http-read-timeout", c.HTTP.ReadTimeout, "longest time to read a request, body included")
	fs.DurationVar(&c.HTTP.WriteTimeout, "http-write-timeout", c.HTTP.WriteTimeout, "longest time to write a response")
	fs.DurationVar(&c.HTTP.IdleTimeout, "http-idle-timeout", c.HTTP.IdleTimeout, "how long an idle kept-alive connection stays open")
	fs.IntVar(&c.HTTP.MaxConnsPerAddr, "max-conns-per-addr", c.HTTP.MaxConnsPerAddr, "connections one client address may hold at once (0: no cap)")
	fs.IntVar(&c.MaxStreams, "max-streams-per-credential", c.MaxStreams, "event streams one API key or user login may hold at once; one more is answered 429 (0: no cap)")
	fs.StringVar(&c.PgBouncer, "pgbouncer", c.PgBouncer, fmt.Sprintf("PgBouncer binary for connection poolers, %d.%d or newer (default %s, which scripts/deps.sh builds, else /usr/sbin/pgbouncer, else PATH); without one, poolers are refused",
		pgbouncer.MinMajor, pgbouncer.MinMinor, pgbouncer.DefaultBinary))
	fs.StringVar(&c.RuntimeDir, "runtime-dir", c.RuntimeDir, "where service instances live (default DATA_DIR/runtime, or /var/lib/dbcloud/HASH when PostgreSQL's OS user cannot reach DATA_DIR)")
	fs.Func("vpc-address-block", `block inside 127.0.0.0/8 for VPC endpoint addresses (default "127.77.0.0/16")`, func(v string) error {
		p, err := netip.ParsePrefix(v)
		if err == nil && (!netip.MustParsePrefix("127.0.0.0/8").Contains(p.Addr()) || p.Bits() < 8) {
			err = errors.New("must lie inside 127.0.0.0/8")
		}
		c.VPCBlock = p
		return err
	})
	fs.DurationVar(&c.SnapshotInterval, "snapshot-interval", c.SnapshotInterval, "how often each service is snapshotted (a base backup)")
	fs.DurationVar(&c.SnapshotRetention, "snapshot-retention", c.SnapshotRetention, "how long snapshots are kept: the point-in-time recovery window")
	fs.DurationVar(&c.LogMaxAge, "log-max-age", c.LogMaxAge, "keep each instance's PostgreSQL logs this long, unless they exceed --log-max-bytes")
	fs.Int64Var(&c.LogMaxBytes, "log-max-bytes", c.LogMaxBytes, "keep at most this many bytes of each instance's PostgreSQL logs (the newest file always stays)")
	fs.Int64Var(&c.StorageLimits.SharedMiB, "storage-shared-mib", c.StorageLimits.SharedMiB, "what a shared service may keep on disk (data, WAL archive, snapshots), in MiB; read-only at 95%")
	fs.Int64Var(&c.StorageLimits.MiBPerMemoryGiB, "storage-mib-per-memory-gib", c.StorageLimits.MiBPerMemoryGiB, "what a dedicated service may keep on disk per GiB of its memory, in MiB")
	fs.DurationVar(&c.RestoreCheckInterval, "restore-check-interval", c.RestoreCheckInterval, "least time between two verified restores of a service: each new snapshot is restored into a scratch instance and checked (pg_amcheck), and the newest again after a day (0: off)")
	fs.IntVar(&c.StorageImageGiB, "storage-image-gib", c.StorageImageGiB, "keep the runtime directory on a btrfs image file of this many GiB (RUNTIME_DIR.img, sparse, loop-mounted; needs root): copy-on-write forks and snapshots and per-service quotas on a host whose filesystem has neither. -1 (the default): where the runtime directory's filesystem has no quotas and dbcloud is root, an image of the host's free disk at its creation less a reserve of max(5% of the filesystem, 4 GiB); 0: none, limits then only measured")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "this process's name in leases (default HOSTNAME:DATA_DIR; keep it stable across restarts)")
	fs.StringVar(&c.CADir, "ca-dir", c.CADir, "directory of the installation's CA (ca.pem, ca-key.pem), made on first use; every control plane of one store uses the same (default DATA_DIR/tls)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "how long a resource's lease outlives the plane's last renewal (renewed every third of it): the takeover time when a plane dies")
	fs.DurationVar(&c.IdleUnit, "test-auto-pause-second", time.Second, "for tests only: how long one second of a service's auto-pause idle_seconds lasts on the idle clock")
	quotaFlags(fs, &c.Quotas)
	metricsFlags(fs, &c.Metrics)
	kubeFlags(fs, c)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if c.NodeID == "" {
		host, _ := os.Hostname()
		abs, _ := filepath.Abs(c.DataDir)
		c.NodeID = host + ":" + abs
	}
	return c.validate()
}

func quotaFlags(fs interface {
	IntVar(p *int, name string, value int, usage string)
}, q *cloud.Quotas) {
	fs.IntVar(&q.Services, "quota-services", q.Services, "services per project")
	fs.IntVar(&q.VPCs, "quota-vpcs", q.VPCs, "VPCs per project")
	fs.IntVar(&q.PeeringsPerVPC, "quota-peerings", q.PeeringsPerVPC, "peerings per VPC")
	fs.IntVar(&q.ReplicaSetsPerService, "quota-replica-sets", q.ReplicaSetsPerService, "read replica sets per service")
	fs.IntVar(&q.MaxReplicaSetNodes, "quota-replica-set-nodes", q.MaxReplicaSetNodes, "nodes per read replica set")
	fs.IntVar(&q.MaxHAReplicas, "quota-ha-replicas", q.MaxHAReplicas, "HA replicas per service")
	fs.IntVar(&q.OwnedProjects, "quota-owned-projects", q.OwnedProjects, "projects one person may own after creating them in the console (0: only the operator makes projects)")
	fs.IntVar(&q.Resources.Instances, "quota-instances", q.Resources.Instances, "running instances per project (primaries, HA standbys, read replica nodes; 0: no limit)")
	fs.IntVar(&q.Resources.CPUMillis, "quota-cpu-millis", q.Resources.CPUMillis, "millicores per project over all running instances (0: no limit)")
	fs.IntVar(&q.Resources.MemoryGBs, "quota-memory-gbs", q.Resources.MemoryGBs, "GiB of memory per project over all running instances (0: no limit)")
	fs.IntVar(&q.Resources.StorageGBs, "quota-storage-gbs", q.Resources.StorageGBs, "GiB of measured storage per project over all instances (0: no limit)")
}

func (c *Config) validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir must not be empty"))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: want HOST:PORT", c.Listen))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if c.PortMin < 1024 || c.PortMax > 65535 || c.PortMin > c.PortMax {
		errs = append(errs, fmt.Errorf("--port-min %d and --port-max %d: want 1024 <= min <= max <= 65535", c.PortMin, c.PortMax))
	}
	if c.StorageLimits.SharedMiB <= 0 || c.StorageLimits.MiBPerMemoryGiB <= 0 {
		errs = append(errs, errors.New("--storage-shared-mib and --storage-mib-per-memory-gib must be above 0"))
	}
	if c.LogMaxAge <= 0 || c.LogMaxBytes <= 0 || c.SnapshotInterval <= 0 || c.SnapshotRetention <= 0 {
		errs = append(errs, fmt.Errorf("--log-max-age, --log-max-bytes, --snapshot-interval and --snapshot-retention must be above 0"))
	}
	if c.StorageImageGiB < local.StorageImageAuto {
		errs = append(errs, errors.New("--storage-image-gib must be -1 (automatic), 0 (off) or a size in GiB"))
	}
	if c.RestoreCheckInterval < 0 {
		errs = append(errs, errors.New("--restore-check-interval must be 0 (off) or more"))
	}
	if c.LeaseTTL < 300*time.Millisecond {
		errs = append(errs, fmt.Errorf("--lease-ttl %v: want at least 300ms", c.LeaseTTL))
	}
	if c.PoolSize < 0 || c.Overcommit <= 0 {
		errs = append(errs, fmt.Errorf("--pool-size must be 0 or more and --overcommit above 0"))
	}
	if c.PoolMaxSize < 0 || c.PoolMemoryShare <= 0 || c.PoolMemoryShare > 1 {
		errs = append(errs, fmt.Errorf("--pool-max-size must be 0 or more and --pool-memory-share above 0 and at most 1"))
	}
	if c.Runtime != "" && c.Runtime != "local" && c.Runtime != "kubernetes" {
		errs = append(errs, fmt.Errorf("--runtime %q: want local or kubernetes", c.Runtime))
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("--log-format %q: want json or text", c.LogFormat))
	}
	if _, err := dbcloud.ParseSizeTable(c.Sizes); err != nil {
		errs = append(errs, fmt.Errorf("--sizes: %w", err))
	}
	if err := c.Metrics.validate(); err != nil {
		errs = append(errs, err)
	}
	if strings.TrimSpace(c.Regions) == "" {
		errs = append(errs, errors.New("--regions must name at least one region"))
	}
	for name, v := range map[string]int{
		"quota-services": c.Quotas.Services, "quota-vpcs": c.Quotas.VPCs, "quota-peerings": c.Quotas.PeeringsPerVPC,
		"quota-replica-sets": c.Quotas.ReplicaSetsPerService, "quota-replica-set-nodes": c.Quotas.MaxReplicaSetNodes,
		"quota-ha-replicas": c.Quotas.MaxHAReplicas, "quota-owned-projects": c.Quotas.OwnedProjects,
	} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("--%s must be 0 or more", name))
		}
	}
	return errors.Join(errs...)
}

func (c *Config) domain() cloud.Config {
	d := cloud.DefaultConfig()
	d.Sizes, _ = dbcloud.ParseSizeTable(c.Sizes)
	d.Regions = nil
	for _, r := range strings.Split(c.Regions, ",") {
		if r = strings.TrimSpace(r); r != "" {
			d.Regions = append(d.Regions, r)
		}
	}
	d.Quotas, d.PublicHost, d.PortMin, d.PortMax = c.Quotas, c.PublicHost, c.PortMin, c.PortMax
	return d
}

// Run opens the store, bootstraps an empty one, and starts serving.
func (m *Main) Run(ctx context.Context) error {
	c := &m.Config
	if m.Logger == nil {
		m.Logger = newLogger(m.stderr, c.LogFormat)
	}
	tlsConfig, err := m.openControlPlane(ctx)
	if err != nil {
		return err
	}

	m.listener, err = net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if err := m.bootstrap(ctx); err != nil {
		m.listener.Close()
		return err
	}
	h := http.NewHandler(m.cloud, http.Config{
		RateLimit: c.RateLimit, RateBurst: c.RateBurst, MaxStreamsPerCredential: c.MaxStreams,
		AuthFailLimit: http.DefaultConfig().AuthFailLimit, AuthFailBurst: http.DefaultConfig().AuthFailBurst,
	}, m.Logger)
	if os.Getenv(crashAfterCommitEnv) == "1" {
		// For the crash tests only: die as a power cut would, between
		// the commit of a change and its response.
		h.AfterIdempotentChange = func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) }
	}
	if err := m.wireMetrics(h); err != nil {
		m.listener.Close()
		return err
	}
	// One origin: the API under its base path, the console, and OAuth
	// login for command-line clients beside it.
	con := console.New(m.cloud, oauth.New(m.cloud), h, m.Logger).WithCA(m.ca.CertPEM)
	m.server = http.NewServer(con, c.HTTP, m.Logger)
	// The console wraps the API's handler, which NewServer then does not
	// see: its event streams, and the console's own, must still end when
	// the server shuts down, or each open one holds the shutdown until its
	// deadline.
	m.server.RegisterOnShutdown(h.StopStreams)
	m.server.RegisterOnShutdown(con.StopStreams)
	m.server.TLSConfig = tlsConfig
	bg, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	// Accepted operations of a previous run are picked up here: the engine
	// reads pending work from the store, nothing from memory.
	if err := m.engine.Open(); err != nil {
		cancel()
		return err
	}
	listener := http.LimitConnsPerAddr(m.listener, c.HTTP.MaxConnsPerAddr)
	m.goLoop(bg, "API server", func(context.Context) { m.server.ServeTLS(listener, "", "") })
	m.goLoop(bg, "purge loop", m.purgeLoop)
	m.Logger.Info("serving", "url", m.URL(), "ca_file", m.CAFile, "data_dir", c.DataDir)
	m.banner()
	return nil
}

// openControlPlane opens what serves and what administers services: the
// store, the CA, the runtime over the data directory, the domain and the
// engine (not yet started). It returns the API's TLS configuration.
func (m *Main) openControlPlane(ctx context.Context) (*tls.Config, error) {
	c := &m.Config
	// Others may traverse the data directory but not list it: PostgreSQL,
	// running as its own OS user, reaches its instances through it.
	if err := os.MkdirAll(c.DataDir, 0o711); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	var err error
	if m.store, err = openStore(ctx, c.DataDir, c.Store); err != nil {
		return nil, err
	}
	tlsConfig, err := m.tlsConfig()
	if err != nil {
		return nil, err
	}
	rt, network, err := m.newRuntime(ctx)
	if err != nil {
		return nil, err
	}
	m.cloud = cloud.New(m.store, rt, c.domain(), m.Logger)
	m.cloud.Network = network
	m.engine = engine.New(m.store, rt, c.NodeID, m.Logger)
	m.engine.Network = network
	m.engine.LeaseTTL = c.LeaseTTL
	m.engine.IdleUnit = c.IdleUnit
	m.cloud.Notify = m.engine.Notify
	// A connection to an auto-paused service asks for its wake, as the
	// system, with admission as for a start (decisions.md section 10).
	if w := dbcloud.CapabilitiesOf(rt).Waker; w != nil {
		w.SetWakeHandler(m.cloud.WakeService)
	}
	return tlsConfig, nil
}

// newRuntime opens the runtime --runtime names and its network.
func (m *Main) newRuntime(ctx context.Context) (runtimeProvisioner, dbcloud.Network, error) {
	if m.Config.Runtime == "kubernetes" {
		return m.kubernetesRuntime(ctx)
	}
	return m.localRuntime(ctx)
}

// localRuntime runs services as processes on this host.
func (m *Main) localRuntime(ctx context.Context) (runtimeProvisioner, dbcloud.Network, error) {
	c := &m.Config
	runtimeDir, err := m.runtimeDir()
	if err != nil {
		return nil, nil, err
	}
	if c.Store != "" && (c.RuntimeDir == "" || c.CADir == "") {
		m.Logger.Info("this plane's runtime directory or CA is its own: another control plane on the store cannot finish its work or share its CA; give every plane the same --runtime-dir and --ca-dir (docs/multi-plane.md)",
			"runtime_dir", runtimeDir, "node_id", c.NodeID)
	}
	m.runtime, err = local.New(local.Config{
		BinDir: c.PGBinDir, BinDirs: pgbin.Installed(""), DataDir: runtimeDir, Host: c.PublicHost, CA: m.ca,
		PoolSize: c.PoolSize, PoolMaxSize: c.PoolMaxSize, PoolMemoryShare: c.PoolMemoryShare,
		Overcommit: c.Overcommit, Logger: m.Logger,
		SnapshotInterval: c.SnapshotInterval, SnapshotRetention: c.SnapshotRetention,
		LogRetention: local.LogRetention{MaxAge: c.LogMaxAge, MaxBytes: c.LogMaxBytes},
		PgBouncer:    c.PgBouncer, StorageImageGiB: c.StorageImageGiB, StorageLimits: c.StorageLimits,
		RestoreCheckInterval: c.RestoreCheckInterval,
	})
	if err != nil {
		return nil, nil, err
	}
	if err := m.runtime.Open(ctx); err != nil {
		return nil, nil, err
	}
	network, err := loopback.New(c.VPCBlock, c.PortMin, c.PortMax)
	if err != nil {
		return nil, nil, fmt.Errorf("--vpc-address-block: %w", err)
	}
	return m.runtime, network, nil
}

// URL is the API's base URL.
func (m *Main) URL() string {
	return "https://" + m.listener.Addr().String() + http.BasePath
}

// Cloud returns the domain service, for in-process tests.
func (m *Main) Cloud() *cloud.Cloud { return m.cloud }

// goLoop runs one of the server's long-lived loops under supervise: a
// panic in it is logged and the loop started again, where it would have
// ended the process and every tenant's control plane with it. A server's
// loop ends when the server is shut down, the others when ctx ends.
func (m *Main) goLoop(ctx context.Context, name string, fn func(ctx context.Context)) {
	if m.background.Logger == nil { // set once, before the first goroutine reads it
		m.background.Logger = m.Logger
	}
	m.background.Loop(ctx, supervise.Task{Name: name}, fn)
}

// purgeLoop forgets idempotency keys, operations and events past their
// lifetime.
func (m *Main) purgeLoop(ctx context.Context) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := m.cloud.PurgeIdempotency(ctx); err != nil && ctx.Err() == nil {
			m.Logger.Warn("purge idempotency keys", "error", err)
		} else if n > 0 {
			m.Logger.Info("purged idempotency keys", "count", n)
		}
		if ops, evs, err := m.cloud.PurgeHistory(ctx); err != nil && ctx.Err() == nil {
			m.Logger.Warn("purge history", "error", err)
		} else if ops+evs > 0 {
			m.Logger.Info("purged history", "operations", ops, "events", evs)
		}
		if _, err := m.cloud.PurgeUserTokens(ctx); err != nil && ctx.Err() == nil {
			m.Logger.Warn("purge expired user tokens", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close stops serving, letting requests in flight finish, and closes the store.
func (m *Main) Close() error {
	var errs []error
	if m.server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, m.server.Shutdown(ctx))
		cancel()
	}
	if m.metricsServer != nil {
		errs = append(errs, m.metricsServer.Close())
	}
	if m.cancel != nil {
		m.cancel()
	}
	m.background.Wait()
	if m.engine != nil {
		errs = append(errs, m.engine.Close())
	}
	if m.runtime != nil {
		errs = append(errs, m.runtime.Close())
	}
	if m.store != nil {
		errs = append(errs, m.store.Close())
	}
	return errors.Join(errs...)
}

func newLogger(w io.Writer, format string) *slog.Logger {
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, nil))
	}
	return slog.New(slog.NewJSONHandler(w, nil))
}

// tlsConfig loads the configured certificate, or makes a local CA and a
// server certificate for the listen and public hosts.
func (m *Main) tlsConfig() (*tls.Config, error) {
	c := &m.Config
	// The CA exists even with --tls-cert: it issues every service's
	// PostgreSQL certificate.
	dir := filepath.Join(c.DataDir, "tls")
	caDir := c.CADir
	if caDir == "" {
		caDir = dir
	}
	ca, err := tlsca.LoadOrCreateCA(caDir)
	if err != nil {
		return nil, err
	}
	m.ca = ca
	if c.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		return tlsca.ServerConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }), nil
	}
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	for _, h := range []string{c.PublicHost, hostOf(c.Listen)} {
		if h != "" && h != "0.0.0.0" && h != "::" {
			hosts = append(hosts, h)
		}
	}
	// The certificate is renewed while the server runs, before it expires.
	src, err := tlsca.NewServerCertSource(dir, ca, hosts)
	if err != nil {
		return nil, err
	}
	src.OnRenew = func(notAfter time.Time, err error) {
		if err != nil {
			m.Logger.Error("renew the server certificate", "error", err, "current_not_after", notAfter)
			return
		}
		m.Logger.Info("server certificate renewed", "not_after", notAfter)
	}
	m.CAFile = filepath.Join(caDir, tlsca.CAFile)
	return tlsca.ServerConfig(src.GetCertificate), nil
}

// runtimeDir is where services' instances live: --runtime-dir, else
// DATA_DIR/runtime when PostgreSQL's OS user can reach it, else a directory
// under /var/lib/dbcloud named for the data directory (a data directory in
// a private home such as /root is not reachable by that user).
func (m *Main) runtimeDir() (string, error) {
	c := &m.Config
	if c.RuntimeDir != "" {
		return c.RuntimeDir, postgres.ServerCanReach(filepath.Dir(c.RuntimeDir))
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return "", err
	}
	if postgres.ServerCanReach(abs) == nil {
		return filepath.Join(abs, "runtime"), nil
	}
	sum := sha256.Sum256([]byte(abs))
	dir := filepath.Join("/var/lib/dbcloud", hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("runtime directory: %w", err)
	}
	m.Logger.Info("PostgreSQL's OS user cannot reach the data directory; instances live elsewhere",
		"data_dir", abs, "runtime_dir", dir)
	return dir, postgres.ServerCanReach(dir)
}

func hostOf(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return h
}

// bootstrapFile is DATA_DIR/bootstrap.json: what a newcomer needs to call the API.
type bootstrapFile struct {
	ProjectID string `json:"project_id"`
	AccessKey string `json:"access_key"`
	SecretKey string `json:"secret_key"`
	APIURL    string `json:"api_url"`
	CAFile    string `json:"ca_file,omitempty"`
	// The first owner's console sign-in; the password is shown only here.
	ConsoleURL    string `json:"console_url,omitempty"`
	OwnerEmail    string `json:"owner_email,omitempty"`
	OwnerPassword string `json:"owner_password,omitempty"`
}

// bootstrap creates the first project and key of an empty store and writes
// them, readable by the owner only, to bootstrap.json.
func (m *Main) bootstrap(ctx context.Context) error {
	c := &m.Config
	b, err := m.cloud.Bootstrap(ctx, c.AdminName, c.AdminEmail)
	if err != nil || b == nil {
		return err
	}
	path := filepath.Join(c.DataDir, "bootstrap.json")
	host, port, _ := net.SplitHostPort(m.listener.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	body, _ := json.MarshalIndent(bootstrapFile{
		ProjectID: b.Project.ID, AccessKey: b.Key.AccessKey, SecretKey: b.Key.SecretKey,
		APIURL: "https://" + net.JoinHostPort(host, port) + http.BasePath, CAFile: m.CAFile,
		ConsoleURL: "https://" + net.JoinHostPort(host, port) + "/", OwnerEmail: b.User.Email, OwnerPassword: b.Password,
	}, "", "  ")
	if err := atomicfile.Write(path, append(body, '\n'), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	m.Logger.Info("created the default project and an API key", "project_id", b.Project.ID,
		"access_key", b.Key.AccessKey, "credentials_file", path)
	return nil
}
