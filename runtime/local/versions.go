package local

import (
	"fmt"
	"slices"
	"strconv"

	"dbcloud"
	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/postgres"
)

// addVersions gives main (the Instances of cfg.BinDir, which holds
// mainV, made with pgCfg) an Instances for every other installed version
// in cfg.BinDirs, each with its own pool beside main's (pool-<major>), and
// returns the versions services can run on, oldest first, with their
// binaries by major. A version that cannot run services (no dbcloud_guard
// built for it) is left out with a warning: creates asking for it are
// refused, naming the versions there are.
func addVersions(cfg Config, pgCfg postgres.Config, main *postgres.Instances, mainV dbcloud.PGVersion) ([]dbcloud.PGVersion, map[int]string) {
	mainMajor := mainV.Major
	versions := []dbcloud.PGVersion{mainV}
	binDirs := map[int]string{mainMajor: cfg.BinDir}
	for major, binDir := range cfg.BinDirs {
		if major == mainMajor {
			continue
		}
		v, err := versionOf(binDir, major)
		if err == nil {
			pgCfg.PoolSize = poolSizeOf(cfg, major)
			err = addVersion(pgCfg, main, binDir, major)
		}
		if err != nil {
			cfg.Logger.Warn("PostgreSQL version left out: services cannot run on it", "pg_version", major, "bin_dir", binDir, "error", err)
			continue
		}
		versions = append(versions, v)
		binDirs[major] = binDir
	}
	slices.SortFunc(versions, func(a, b dbcloud.PGVersion) int { return a.Major - b.Major })
	return versions, binDirs
}

// poolSizeOf is the pool kept for a version: the configured one for the
// newest, which creates get unless they name another, and at most one
// prepared cluster for each older version, whose pool grows only during a
// burst of creates naming it. A full pool per version would prepare
// clusters at every start that hardly any create claims.
func poolSizeOf(cfg Config, major int) int {
	for other := range cfg.BinDirs {
		if other > major {
			return min(cfg.PoolSize, 1)
		}
	}
	return cfg.PoolSize
}

// versionOf reads binDir's version, which must be major.
func versionOf(binDir string, major int) (dbcloud.PGVersion, error) {
	v, err := installedVersion(binDir)
	if err == nil && v.Major != major {
		err = fmt.Errorf("%s holds PostgreSQL %s, not %d", binDir, v.Full, major)
	}
	return v, err
}

// installedVersion is the version of binDir's binaries, with the
// extensions built for it.
func installedVersion(binDir string) (dbcloud.PGVersion, error) {
	major, full, err := pgbin.Version(binDir)
	if err != nil {
		return dbcloud.PGVersion{}, err
	}
	return dbcloud.PGVersion{Major: major, Full: full, Extensions: Extensions(binDir)}, nil
}

// addVersion makes the Instances of one more version, with main's pool
// settings, supervisor, cgroups and OS identities, and hands it to main.
func addVersion(pgCfg postgres.Config, main *postgres.Instances, binDir string, major int) error {
	pgCfg.BinDir = binDir
	pgCfg.PoolDir = pgCfg.PoolDir + "-" + strconv.Itoa(major)
	pgCfg.Logger = pgCfg.Logger.With("pg_version", major)
	v, err := postgres.NewInstances(pgCfg)
	if err != nil {
		return err
	}
	main.AddVersion(v)
	return nil
}

// PGVersions lists the PostgreSQL versions services can run on, oldest
// first.
func (rt *Runtime) PGVersions() []dbcloud.PGVersion { return rt.versions }

// binDirOf is where the binaries of the service's version are: the main
// version's for a service recorded before services chose one.
func (rt *Runtime) binDirOf(svc *dbcloud.Service) (string, error) {
	if svc.Spec.PGVersion == dbcloud.PGVersionUnknown {
		return rt.cfg.BinDir, nil
	}
	dir, ok := rt.binDirs[svc.Spec.PGVersion]
	if !ok {
		return "", fmt.Errorf("service %s runs PostgreSQL %d, which this host does not have (installed: %s)",
			svc.ID, svc.Spec.PGVersion, dbcloud.ListPGVersions(rt.versions))
	}
	return dir, nil
}
