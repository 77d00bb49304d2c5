// Package local runs services as PostgreSQL processes on this host: the
// embedded default runtime.
package local

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"dbcloud"
	"dbcloud/internal/supervise"
	"dbcloud/pglog"
	"dbcloud/runtime/local/backup"
	"dbcloud/runtime/local/internal/cgroup"
	"dbcloud/runtime/local/internal/osuser"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/internal/volume"
	"dbcloud/runtime/local/pgbouncer"
	"dbcloud/runtime/local/postgres"
	"dbcloud/runtime/local/proxy"
	"dbcloud/sizing"
	"dbcloud/tlsca"
)

// Config says where and how the runtime runs services.
type Config struct {
	// BinDir holds the PostgreSQL server binaries of the host's main
	// version, which services recorded without a version run.
	BinDir string
	// BinDirs holds the binaries of every installed PostgreSQL version
	// by major (pgbin.Installed); services run on the version they chose
	// (versions.go). BinDir's version need not be in it.
	BinDirs map[int]string
	// DataDir holds services/<id> and the pool of prepared clusters.
	DataDir string
	// Host is the endpoint host: instances listen on it and their
	// certificates name it.
	Host string
	// CA issues each service's server certificate.
	CA *tlsca.CA
	// PoolSize is how many prepared clusters wait for creates.
	PoolSize int
	// PoolMaxSize and PoolMemoryShare bound the pool's growth during a
	// burst of creates (postgres.Instances); zero takes the defaults.
	PoolMaxSize     int
	PoolMemoryShare float64
	// Overcommit is how many times the host's CPU and memory the sizes of
	// all running instances may add up to (the domain admits against it):
	// idle PostgreSQL uses far less than its size.
	Overcommit float64
	Logger     *slog.Logger
	// SnapshotInterval is how often each service is snapshotted (a base
	// backup); 0 means DefaultSnapshotInterval (24 h).
	SnapshotInterval time.Duration
	// SnapshotRetention is how long snapshots are kept, the PITR window;
	// 0 means DefaultSnapshotRetention (7 days).
	SnapshotRetention time.Duration
	// LogRetention bounds each instance's PostgreSQL logs; zero fields take
	// DefaultLogRetention's.
	LogRetention LogRetention
	// PgBouncer is the PgBouncer binary; empty finds Debian's, else one on
	// PATH.
	PgBouncer string
	// StorageLimits size what each service may keep on disk; zero fields
	// take sizing.DefaultStorageLimits'.
	StorageLimits sizing.StorageLimits
	// RestoreCheckInterval is the least time between two verified
	// restores of a service (each new snapshot is verified, and the
	// newest again after a day); 0 turns the checks off.
	RestoreCheckInterval time.Duration
	// StorageImageGiB, when above 0, keeps DataDir on a btrfs image of that
	// size (DataDir + ".img", sparse), loop-mounted: copy-on-write clones
	// and per-service quotas on a host whose filesystem has neither.
	// StorageImageAuto makes one sized from the host's free disk where
	// DataDir's filesystem has no quotas (volumes.go); 0 makes none.
	StorageImageGiB int
}

// Runtime is the local runtime: the domain's Runtime and the engine's
// Provisioner, on PostgreSQL processes of this host.
type Runtime struct {
	cfg       Config
	instances *postgres.Instances
	poolers   *pgbouncer.Poolers
	proxies   *proxy.Controller
	backups   *backup.Backups
	cgroups   *cgroup.Hierarchy
	volumes   *volume.Volumes
	// diskReserve is the free space on DataDir's filesystem that admission
	// never hands out (volumes.go).
	diskReserve int64
	roots       *x509.CertPool // the CA that endpoints must present
	// users makes each service's OS identity (identity.go); nil when
	// dbcloud is not root and every service runs as dbcloud's user.
	users *osuser.Manager

	// versions are the PostgreSQL versions services run on, oldest
	// first, and binDirs their binaries by major (versions.go).
	versions []dbcloud.PGVersion
	binDirs  map[int]string

	mu        sync.Mutex
	cpu       map[string]cpuSample  // last CPU reading per service, for rates
	xacts     map[string]xactSample // last transaction count per service, for rates
	downSince map[string]time.Time  // since when each HA service's primary is seen dead
	// storageNear says which services were last measured near their
	// storage limit, whose next measurement is made fresh.
	storageNear map[string]bool
	storage     map[string]storageSample // last storage measurement per service (metrics.go)
	quiet       map[string]time.Time     // until when each service has no backup work due (backup_due.go)
	cursorKey   []byte                   // signs log cursors; read from its file once
	logPaths    []pglog.PathName         // host paths log messages may name (logs.go); found once
	credLogins  credentialLogins         // last logins of credential roles (credentials.go)
	credSyncs   keyedMutex               // one credential sync per service at a time (credentials.go)
	watches     primaryWatches           // HA primaries whose exit is watched (watch.go)
	sessions    metricsSessions          // a kept session per measured service (metrics.go)

	// wakes holds the endpoints of auto-paused services (wake.go).
	wakes wakers

	stopLogs   context.CancelFunc // ends the log retention loop
	background supervise.Group    // runs it
}

type cpuSample struct {
	nanos uint64
	at    time.Time
}

// The local runtime has every optional capability of the contract
// (dbcloud/runtime.go); TestCapabilities keeps it so.
var (
	_ dbcloud.Runtime               = (*Runtime)(nil)
	_ dbcloud.Provisioner           = (*Runtime)(nil)
	_ dbcloud.ReplicaSetProvisioner = (*Runtime)(nil)
	_ dbcloud.Backups               = (*Runtime)(nil)
	_ dbcloud.BackupMaintainer      = (*Runtime)(nil)
	_ dbcloud.SnapshotLister        = (*Runtime)(nil)
	_ dbcloud.RestoreChecker        = (*Runtime)(nil)
	_ dbcloud.Capacity              = (*Runtime)(nil)
	_ dbcloud.FailureWatcher        = (*Runtime)(nil)
	_ dbcloud.Waker                 = (*Runtime)(nil)
	_ dbcloud.Upgrader              = (*Runtime)(nil)
)

// New returns a local runtime; Open starts filling its pool.
func New(cfg Config) (*Runtime, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Overcommit <= 0 {
		cfg.Overcommit = 4
	}
	if cfg.StorageLimits.SharedMiB <= 0 {
		cfg.StorageLimits.SharedMiB = sizing.DefaultStorageLimits.SharedMiB
	}
	if cfg.StorageLimits.MiBPerMemoryGiB <= 0 {
		cfg.StorageLimits.MiBPerMemoryGiB = sizing.DefaultStorageLimits.MiBPerMemoryGiB
	}
	if cfg.CA == nil {
		return nil, fmt.Errorf("local runtime: a CA is required")
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	cfg.DataDir = dir
	volumes, diskReserve, err := openVolumes(cfg)
	if err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	for _, d := range []string{cfg.DataDir, filepath.Join(dir, "services"), filepath.Join(dir, "pool")} {
		// Traversable, not listable: PostgreSQL's OS user passes through.
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("local runtime: %w", err)
		}
	}
	sup := proc.NewSupervisor()
	cgroups := cgroup.NewHierarchy(cfg.Logger)
	var users *osuser.Manager
	// The pool makes an identity with each prepared cluster (identity.go).
	var identities postgres.Identities
	if os.Geteuid() == 0 {
		users = osuser.New(osuser.DefaultPrefix, osuser.SystemTools(), cfg.Logger)
		identities = users
	}
	mainV, err := installedVersion(cfg.BinDir)
	if err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	pgCfg := postgres.Config{
		BinDir: cfg.BinDir, PoolDir: filepath.Join(dir, "pool"), PoolSize: poolSizeOf(cfg, mainV.Major),
		PoolMaxSize: cfg.PoolMaxSize, PoolMemoryShare: cfg.PoolMemoryShare, Identities: identities,
		Volumes: volumes, Logger: cfg.Logger, Supervisor: sup, Cgroups: cgroups,
	}
	instances, err := postgres.NewInstances(pgCfg)
	if err != nil {
		return nil, err
	}
	versions, binDirs := addVersions(cfg, pgCfg, instances, mainV)
	proxyExe := ""
	if users != nil {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("local runtime: %w", err)
		}
		if proxyExe, err = proxyBinary(dir, exe); err != nil {
			return nil, fmt.Errorf("local runtime: %w", err)
		}
	}
	proxies, err := proxy.NewController(sup, proxyExe, cfg.Logger)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(cfg.CA.Cert)
	poolers := pgbouncer.New(pgbouncer.Config{
		Instances: instances, Supervisor: sup, Cgroups: cgroups, Roots: roots, Logger: cfg.Logger,
		Binary: cfg.PgBouncer,
	})
	return &Runtime{
		cfg:         cfg,
		instances:   instances,
		versions:    versions,
		binDirs:     binDirs,
		poolers:     poolers,
		proxies:     proxies,
		backups:     backup.New(instances, cfg.BinDir, cfg.Logger),
		cgroups:     cgroups,
		volumes:     volumes,
		diskReserve: diskReserve,
		roots:       roots,
		users:       users,
		cpu:         map[string]cpuSample{},
		xacts:       map[string]xactSample{},
		downSince:   map[string]time.Time{},
		storageNear: map[string]bool{},
		storage:     map[string]storageSample{},
		quiet:       map[string]time.Time{},
		wakes:       wakers{logger: cfg.Logger, goroutines: supervise.Group{Logger: cfg.Logger}, held: map[string]*pausedService{}, released: map[string]int64{}},
	}, nil
}

// Open starts the pool refill and the log retention loop; running
// instances need nothing: they are adopted when the engine next ensures or
// checks them.
func (rt *Runtime) Open(ctx context.Context) error {
	// A host that does not let dbcloud make OS users fails here, before
	// any service is half made.
	if rt.users != nil {
		if err := rt.users.Check(ctx); err != nil {
			return err
		}
	}
	if err := rt.instances.Open(ctx); err != nil {
		return err
	}
	logCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rt.stopLogs = cancel
	rt.background.Logger = rt.cfg.Logger
	rt.background.Loop(logCtx, supervise.Task{Name: "log retention", Attrs: []any{"data_dir", rt.cfg.DataDir}},
		func(ctx context.Context) { rt.RunLogRetention(ctx, rt.cfg.LogRetention) })
	return nil
}

// Close stops the background work. Instances keep running.
func (rt *Runtime) Close() error {
	rt.closeWatches()
	rt.wakes.closeAll()
	rt.sessions.closeAll(context.Background())
	if rt.stopLogs != nil {
		rt.stopLogs()
		rt.background.Wait()
	}
	return rt.instances.Close()
}

// DrainPool removes the pool's prepared clusters and their OS users, and
// stops its refill: for a teardown of the runtime directory, once every
// service is gone.
func (rt *Runtime) DrainPool(ctx context.Context) error {
	return rt.instances.DrainPool(ctx)
}

func (rt *Runtime) serviceDir(id string) string {
	return filepath.Join(rt.cfg.DataDir, "services", id)
}

// primary returns the spec of the service's current primary, from the
// service and its HA state alone: it writes nothing and carries no TLS
// material, which only starting an instance needs (preparePrimary).
func (rt *Runtime) primary(svc *dbcloud.Service) (postgres.Spec, error) {
	base, err := rt.instanceBase(svc)
	if err != nil {
		return postgres.Spec{}, err
	}
	// With HA replicas the primary may be another instance, on an internal
	// port behind the endpoint proxy (ha.go).
	return rt.currentPrimary(svc, base)
}

// preparePrimary is primary with the service's directory made and its TLS
// certificate issued (once) and included: what an ensure starts.
func (rt *Runtime) preparePrimary(ctx context.Context, svc *dbcloud.Service) (postgres.Spec, error) {
	base, err := rt.preparedBase(ctx, svc)
	if err != nil {
		return postgres.Spec{}, err
	}
	return rt.currentPrimary(svc, base)
}

// instanceBase is the spec of instance 0 on the endpoint port, without TLS
// material: a pure function of the service.
func (rt *Runtime) instanceBase(svc *dbcloud.Service) (postgres.Spec, error) {
	if svc.Endpoint == nil {
		return postgres.Spec{}, dbcloud.Terminal(fmt.Errorf("service %s has no endpoint", svc.ID))
	}
	res := sizing.For(svc.Spec.Size)
	listen := rt.listenAddr()
	if ep := svc.VPCEndpoint; ep != nil && listen != "*" {
		// Attached to a VPC: also listen on the service's own address there.
		listen += "," + ep.Host
	}
	owner, err := rt.lookupOwner(svc.ID)
	if err != nil {
		return postgres.Spec{}, err
	}
	binDir, err := rt.binDirOf(svc)
	if err != nil {
		return postgres.Spec{}, err
	}
	settings := rt.storageSettings(svc.ID, rt.cfg.StorageLimits.Of(svc.Spec.Size), sizing.WithAddons(res, svc.Spec.Addons))
	if rt.logicalWAL(svc.ID) {
		settings["wal_level"] = "logical"
	}
	return postgres.Spec{
		ID: svc.ID + "-0", Dir: filepath.Join(rt.serviceDir(svc.ID), "0"), ListenAddr: listen, BinDir: binDir,
		Port: svc.Endpoint.Port, Settings: settings,
		CPUMillis: res.CPUMillis, CPUShares: res.CPUShares, MemoryBytes: res.MemoryBytes, ArchiveDir: rt.archiveDir(svc.ID),
		Owner: owner,
	}, nil
}

// preparedBase is instanceBase with the service's directory made and its
// certificate in the spec.
func (rt *Runtime) preparedBase(ctx context.Context, svc *dbcloud.Service) (postgres.Spec, error) {
	// The volume first, so that a cluster claimed from the pool is
	// renamed into it, unless the pool's entries are volumes: then a new
	// service's volume is one, claimed whole, and limited here after. Then
	// the service's OS identity: everything below is its.
	if err := rt.claimVolume(ctx, svc); err != nil {
		return postgres.Spec{}, err
	}
	if err := rt.makeServiceVolume(ctx, svc, rt.serviceDir(svc.ID)); err != nil {
		return postgres.Spec{}, err
	}
	// The certificate needs neither the identity nor the cluster: it is
	// issued (and its files synced) beside their claim, not after it.
	// Every return waits for it, so nothing writes into the service's
	// directory once this ensure has ended.
	var (
		certPEM, keyPEM []byte
		certErr         error
		issuing         sync.WaitGroup
	)
	issuing.Add(1)
	go func() {
		defer issuing.Done()
		// A panic here is this ensure's error: the engine's Call, which
		// makes it the service's failed attempt, does not see this goroutine.
		certErr = supervise.Call(func() (err error) {
			certPEM, keyPEM, err = rt.serverCert(svc)
			return err
		})
	}()
	defer issuing.Wait()
	if _, err := rt.ensureOwner(ctx, svc); err != nil {
		return postgres.Spec{}, err
	}
	stepDone(ctx, "os_user")
	base, err := rt.instanceBase(svc)
	if err != nil {
		return postgres.Spec{}, err
	}
	// The service directory is traversable by the service's user so its
	// servers reach their instance directories (its tls/ stays private),
	// and by no other. The mode is set every time, which also heals a
	// directory left with another one.
	if err := rt.makeServiceDir(svc.ID, base.Owner); err != nil {
		return postgres.Spec{}, err
	}
	if err := rt.finishClaim(svc.ID); err != nil {
		return postgres.Spec{}, err
	}
	if err := rt.logicalAtStart(svc, &base); err != nil {
		return postgres.Spec{}, err
	}
	stepDone(ctx, "service_dir")
	issuing.Wait()
	if certErr != nil {
		return postgres.Spec{}, certErr
	}
	base.CertPEM, base.KeyPEM = certPEM, keyPEM
	stepDone(ctx, "tls_cert")
	return base, nil
}

// listenAddr is what instances listen on: the endpoint host when it is an
// address, every address when it is a name.
func (rt *Runtime) listenAddr() string {
	if net.ParseIP(rt.cfg.Host) != nil {
		return rt.cfg.Host
	}
	return "*"
}

// stopInstance stops an instance of a service, its kept metrics session
// first: every stop goes through here, since a session left open would
// hold up the smart shutdown that Stop tries first.
func (rt *Runtime) stopInstance(ctx context.Context, spec postgres.Spec, timeout time.Duration) error {
	rt.sessions.closeInstance(ctx, spec.ID)
	return rt.instances.Stop(ctx, spec, timeout)
}

// EnsureService makes the service's primary match its spec.
func (rt *Runtime) EnsureService(ctx context.Context, svc *dbcloud.Service) (*dbcloud.Observation, error) {
	// A stop, a restart or a failover may come: the metrics session
	// would hold up a smart shutdown (metricsSessions).
	rt.sessions.close(ctx, svc.ID)
	ctx, steps := withSteps(ctx)
	obs, err := rt.ensureService(ctx, svc)
	if err == nil {
		rt.settled(svc)
		rt.cfg.Logger.Info("service ensured", append([]any{"service", svc.ID}, steps.logAttrs()...)...)
	}
	return obs, userError(err)
}

func (rt *Runtime) ensureService(ctx context.Context, svc *dbcloud.Service) (_ *dbcloud.Observation, err error) {
	var held *wakeEpisode
	if svc.Spec.Running {
		// A wake (or a start) of an auto-paused service: its addresses
		// go to its postmaster and pooler, and the clients held meanwhile
		// are spliced to them, or told why this failed.
		held = rt.releaseWake(svc.ID, svc.Generation)
		defer func() {
			if err != nil {
				held.fail(wakeFailure(err))
			}
		}()
	}
	if rt.isHA(svc) {
		return rt.ensureHA(ctx, svc)
	}
	spec, err := rt.preparePrimary(ctx, svc)
	if err != nil {
		return nil, err
	}
	// A fork's data comes from its parent before its first start.
	if err := rt.ensureForkData(ctx, svc, spec); err != nil {
		return nil, err
	}
	obs := &dbcloud.Observation{Instances: []dbcloud.Instance{{ID: spec.ID, Role: "primary"}}}
	if !svc.Spec.Running {
		// The pooler first, so its clients are told before the server goes.
		if err := rt.stopPooler(ctx, svc.ID); err != nil {
			return nil, err
		}
		if err := rt.stopInstance(ctx, spec, 30*time.Second); err != nil {
			return nil, fmt.Errorf("stop %s: %w", spec.ID, err)
		}
		if !svc.AutoPaused() {
			// Stopped, not auto-paused: connections are refused again.
			rt.releaseWake(svc.ID, svc.Generation).fail("it was stopped")
			return obs, nil
		}
		// Its endpoints listen again at once, in this process; the
		// pooler's still wakes it, so it is still shown.
		if err := rt.HoldPaused(ctx, svc); err != nil {
			return nil, err
		}
		if svc.Spec.Pooler && svc.PoolerPort > 0 {
			obs.PoolerEndpoint = &dbcloud.Endpoint{Host: svc.Endpoint.Host, Port: svc.PoolerPort}
		}
		return obs, nil
	}
	if err := rt.instances.Ensure(ctx, spec); err != nil {
		return nil, err
	}
	// The clients that woke it go through now, while the rest of the
	// ensure (password, addons, pooler) is done.
	held.serving()
	stepDone(ctx, "instance")
	if err := rt.servePrimary(ctx, svc, spec, obs); err != nil {
		return nil, err
	}
	return obs, nil
}

// userError turns what a caller can act on into the sentence users read;
// other errors pass as they are (the engine shows a generic reason and
// logs them). A full disk is retryable: the instance starts once space is
// freed.
func userError(err error) error {
	var full *postgres.DiskFullError
	if errors.As(err, &full) {
		return fmt.Errorf("%w (%v)", dbcloud.Errorf(dbcloud.KindUnavailable,
			"The disk holding this service's data is full (%d MiB free); it starts again by itself once space is freed: delete data, resize the service, or ask the operator to free disk space.",
			full.FreeBytes>>20), err)
	}
	return err
}

// servePrimary is the end of every ensure of a running service, HA or
// not: the password and addons on the running primary (slots of deleted
// read replica sets dropped), its endpoints checked, its pooler, and what
// obs reports of it. Its usage is left to the next health check, within a
// second or so: measuring here (a walk of the data directory and another
// session) would delay every READY for numbers nobody has waited for.
func (rt *Runtime) servePrimary(ctx context.Context, svc *dbcloud.Service, primary postgres.Spec, obs *dbcloud.Observation) error {
	// One superuser session for both: each new session forks a backend
	// under the instance's CPU quota.
	conn, err := rt.instances.Connect(ctx, primary, "postgres")
	if err != nil {
		return fmt.Errorf("set password on %s: %w", primary.ID, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := setVerifierOn(ctx, conn, primary, svc.PasswordVerifier); err != nil {
		return err
	}
	stepDone(ctx, "password")
	if err := postgres.RevokeReservedMemberships(ctx, conn); err != nil {
		return fmt.Errorf("on %s: %w", primary.ID, err)
	}
	if err := rt.dropStaleSlots(ctx, conn, primary); err != nil {
		return err
	}
	stepDone(ctx, "slots")
	for _, a := range svc.Spec.Addons {
		ext := a.Extension()
		if err := rt.instances.Exec(ctx, primary, "tsdb", "CREATE EXTENSION IF NOT EXISTS "+postgres.QuoteIdent(ext)+" SCHEMA public"); err != nil {
			return fmt.Errorf("create extension %s in %s: %w", ext, primary.ID, err)
		}
	}
	if err := rt.checkEndpoint(ctx, svc.Endpoint); err != nil {
		return err
	}
	if ep := svc.VPCEndpoint; ep != nil {
		if err := rt.checkEndpoint(ctx, &ep.Endpoint); err != nil {
			return err
		}
	}
	stepDone(ctx, "endpoint")
	if obs.PoolerEndpoint, err = rt.ensurePooler(ctx, svc, primary, primary, svc.PoolerPort); err != nil {
		return err
	}
	stepDone(ctx, "pooler")
	obs.Running = true
	return nil
}

// CheckService reports whether the primary runs, and its usage if asked.
func (rt *Runtime) CheckService(ctx context.Context, svc *dbcloud.Service, measure bool) (*dbcloud.Observation, error) {
	if rt.isHA(svc) {
		return rt.checkHA(ctx, svc, measure)
	}
	spec, err := rt.primary(svc)
	if err != nil {
		return nil, err
	}
	obs := &dbcloud.Observation{Instances: []dbcloud.Instance{{ID: spec.ID, Role: "primary"}}}
	if _, ok := rt.instances.Running(spec); !ok {
		obs.Reason = "The primary's postmaster is not running; restarting it."
		return obs, nil
	}
	return rt.checkServing(ctx, svc, spec, obs, measure), nil
}

// checkServing is the end of every check of a running primary, HA or not:
// the pooler must run too, and the primary's usage is measured if asked.
func (rt *Runtime) checkServing(ctx context.Context, svc *dbcloud.Service, primary postgres.Spec, obs *dbcloud.Observation, measure bool) *dbcloud.Observation {
	if svc.Spec.Pooler && !rt.poolerRunning(svc.ID) {
		obs.Reason = "The connection pooler is not running; restarting it."
		return obs
	}
	obs.Running = true
	if svc.AutoPause != nil {
		obs.Sessions = rt.clientSessions(svc)
	}
	if measure {
		obs.Metrics = rt.metrics(ctx, svc, primary)
		if obs.Metrics != nil {
			used, err := rt.measureStorage(ctx, svc.ID, primary, obs.Metrics.Database)
			if err != nil {
				rt.cfg.Logger.Warn("storage not measured", "service", svc.ID, "error", err)
				return obs
			}
			obs.Metrics.StorageMB = used >> 20
			rt.enforceStorage(svc, used, obs)
			if obs.Notice == "" {
				obs.Notice = rt.restoreNotice(svc)
			}
		}
	}
	return obs
}

// checkEndpoint proves the endpoint serves TLS with the service's
// certificate, as a client with sslmode=verify-full would see it.
func (rt *Runtime) checkEndpoint(ctx context.Context, ep *dbcloud.Endpoint) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return postgres.ProbeTLS(ctx, net.JoinHostPort(ep.Host, strconv.Itoa(ep.Port)), ep.Host, rt.roots)
}

// metrics reads usage: CPU as a rate since the last reading, memory as the
// working set, and what the database and its pooler report (metrics.go);
// the caller measures storage (measureStorage).
func (rt *Runtime) metrics(ctx context.Context, svc *dbcloud.Service, spec postgres.Spec) *dbcloud.Metrics {
	serviceID := svc.ID
	u, err := rt.instances.CgroupUsage(spec)
	if err != nil {
		return nil
	}
	now := time.Now()
	m := &dbcloud.Metrics{MemoryMB: u.MemoryBytes >> 20, Measured: now.UTC()}
	rt.mu.Lock()
	if last, ok := rt.cpu[serviceID]; ok && now.After(last.at) && u.CPUNanos >= last.nanos {
		m.MilliCPU = int64(float64(u.CPUNanos-last.nanos) / float64(now.Sub(last.at).Nanoseconds()) * 1000)
	}
	rt.cpu[serviceID] = cpuSample{nanos: u.CPUNanos, at: now}
	rt.mu.Unlock()
	m.Database = rt.databaseMetrics(ctx, svc, spec, now)
	return m
}

// HostCapacity reports the host's CPUs, memory and free disk (of the
// storage image where there is one), how many times its CPU and memory
// all instances may reserve together, and the disk a service of a size
// may fill; the service layer decides what fits (cloud/admission.go).
func (rt *Runtime) HostCapacity() (dbcloud.HostCapacity, error) {
	cpu, mem, disk, err := postgres.HostCapacity(rt.cfg.DataDir)
	if err != nil {
		return dbcloud.HostCapacity{}, err
	}
	avail, err := postgres.MemAvailable()
	if err != nil {
		return dbcloud.HostCapacity{}, err
	}
	return dbcloud.HostCapacity{CPUMillis: cpu, MemoryBytes: mem, MemAvailableBytes: avail, Overcommit: rt.cfg.Overcommit, DiskFreeBytes: disk,
		DiskReserveBytes: rt.diskReserve, StorageLimit: rt.cfg.StorageLimits.Of}, nil
}

// Extensions lists the extensions available to the PostgreSQL in binDir.
func Extensions(binDir string) map[string]bool {
	out := map[string]bool{}
	share, err := pgShareDir(binDir)
	if err != nil {
		return out
	}
	files, _ := filepath.Glob(filepath.Join(share, "extension", "*.control"))
	for _, f := range files {
		out[strings.TrimSuffix(filepath.Base(f), ".control")] = true
	}
	return out
}

// PortFree reports whether the port can be bound on the endpoint host.
func (rt *Runtime) PortFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(rt.cfg.Host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// Logs returns a page of the service's log lines, read from the jsonlog
// files of its instances (logs.go), so it needs no running postmaster.
func (rt *Runtime) Logs(ctx context.Context, svc *dbcloud.Service, q dbcloud.LogQuery) (*dbcloud.LogPage, error) {
	return rt.readLogs(ctx, svc, q)
}
