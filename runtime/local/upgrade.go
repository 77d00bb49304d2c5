package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"dbcloud"
	"dbcloud/internal/atomicfile"
	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/internal/volume"
	"dbcloud/runtime/local/postgres"
)

// A major version upgrade in place (decisions.md section 11) works in
// DATA/services/<id>/upgrade, a directory of the service's OS user that
// pg_upgrade runs in (it writes its socket and scripts there), and
// leaves DATA/services/<id>/upgrading while the service's own data may
// be mid-way, saying what a crash left:
//
//   - the rehearsal: an online copy of the running primary (as a NOW
//     fork's), recovered, then pg_upgrade --check and pg_upgrade of the
//     copy, every extension updated in every database and a query run in
//     each; the copy is thrown away;
//   - the service: a snapshot (the way back), the standbys and the
//     primary stopped, pg_upgrade --clone (btrfs) or --link into
//     pgdata.new beside pgdata, the two swapped, the primary started on
//     the new binaries (same port: the endpoint does not move),
//     extensions updated, ANALYZE in stages in the background. The
//     standbys are copied again from the new primary by the ensure that
//     follows.
const (
	upgradeMarker = "upgrading"
	upgradeDir    = "upgrade"
	// upgradePort names the sockets of the rehearsal's servers; they
	// listen on no TCP address, only in the upgrade directory.
	upgradePort = 50432
)

// upgradeRun is one call of UpgradeInPlace.
type upgradeRun struct {
	rt             *Runtime
	svc            *dbcloud.Service
	from, to       dbcloud.PGVersion
	fromBin, toBin string
	spec           postgres.Spec // the primary on the old version
	owner          *syscall.Credential
	work           string
	step           func(dbcloud.UpgradeStep)
	began          time.Time
	log            []logLine // pg_upgrade's and the steps' lines, for the service's log
}

type logLine struct {
	at       time.Time
	severity string
	text     string
}

// UpgradeInPlace upgrades the service's PostgreSQL major version in
// place: a rehearsal on a throwaway copy, then the service itself. See
// dbcloud.Upgrader.
func (rt *Runtime) UpgradeInPlace(ctx context.Context, svc *dbcloud.Service, step func(dbcloud.UpgradeStep)) (string, error) {
	u, err := rt.newUpgrade(ctx, svc, step)
	if err != nil {
		return "", err
	}
	defer u.writeLog()
	if v, _ := dataVersion(u.spec.PGData()); v == u.to.Major {
		// A crash after the swap: the data is the new version's already.
		return u.to.Full, u.finish(ctx)
	}
	if err := u.undoInterrupted(ctx); err != nil {
		return "", err
	}
	if err := u.rehearse(ctx); err != nil {
		return "", u.failed(ctx, "rehearsal", err)
	}
	if err := u.upgradeService(ctx); err != nil {
		return "", u.failed(ctx, "upgrade", err)
	}
	return u.to.Full, u.finish(ctx)
}

func (rt *Runtime) newUpgrade(ctx context.Context, svc *dbcloud.Service, step func(dbcloud.UpgradeStep)) (*upgradeRun, error) {
	from, ok := dbcloud.FindPGVersion(svc.Spec.PGVersion, rt.versions)
	to, ok2 := dbcloud.FindPGVersion(svc.UpgradeTo, rt.versions)
	if !ok || !ok2 {
		return nil, &dbcloud.UpgradeFailed{Step: "accept", Reason: fmt.Sprintf("this host runs PostgreSQL %s", dbcloud.ListPGVersions(rt.versions))}
	}
	spec, err := rt.preparePrimary(ctx, svc)
	if err != nil {
		return nil, err
	}
	u := &upgradeRun{rt: rt, svc: svc, from: from, to: to, fromBin: rt.binDirs[from.Major], toBin: rt.binDirs[to.Major],
		spec: spec, owner: rt.instances.Owner(spec), work: filepath.Join(rt.serviceDir(svc.ID), upgradeDir), began: time.Now(), step: step}
	return u, nil
}

// done reports a step: to the engine (the operation's events), to
// dbcloud's log and to the service's.
func (u *upgradeRun) done(name, detail string) {
	u.rt.cfg.Logger.Info("upgrade step", "service", u.svc.ID, "step", name, "detail", detail)
	u.note("LOG", "upgrade to PostgreSQL "+strconv.Itoa(u.to.Major)+": "+name+": "+detail)
	u.step(dbcloud.UpgradeStep{Name: name, Detail: detail})
}

func (u *upgradeRun) note(severity, text string) {
	u.log = append(u.log, logLine{at: time.Now(), severity: severity, text: text})
}

// failed turns err, which stopped the upgrade at phase, into the
// UpgradeFailed the engine shows, once the service's data is its old
// version's again; a cancelled context is no failure of the upgrade (the
// next attempt starts over).
func (u *upgradeRun) failed(ctx context.Context, phase string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var f *dbcloud.UpgradeFailed
	if !errors.As(err, &f) {
		f = &dbcloud.UpgradeFailed{Step: phase, Reason: "an internal error; the operator's logs have the details"}
	}
	u.rt.cfg.Logger.Error("upgrade failed", "service", u.svc.ID, "step", f.Step, "error", err)
	if uerr := u.undoInterrupted(context.WithoutCancel(ctx)); uerr != nil {
		return fmt.Errorf("upgrade of %s failed (%w) and its old data could not be put back: %w", u.svc.ID, err, uerr)
	}
	// The primary serves again before the engine's ensure, which would
	// otherwise take a stopped HA primary for a lost one and fail over.
	if serr := u.rt.instances.Ensure(context.WithoutCancel(ctx), u.spec); serr != nil {
		return fmt.Errorf("upgrade of %s failed (%w) and its old primary did not start again: %w", u.svc.ID, err, serr)
	}
	u.note("ERROR", "upgrade to PostgreSQL "+strconv.Itoa(u.to.Major)+" failed at "+f.Step+": "+f.Reason)
	u.step(dbcloud.UpgradeStep{Name: "rolled_back", Detail: f.Step + " failed: " + f.Reason})
	_ = os.Remove(filepath.Join(u.rt.serviceDir(u.svc.ID), upgradeMarker))
	return f
}

// dataVersion reads the major version of a data directory.
func dataVersion(pgdata string) (int, error) {
	f, err := tenantfs.Open(filepath.Join(pgdata, "PG_VERSION"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	b := make([]byte, 16)
	n, _ := f.Read(b)
	return strconv.Atoi(strings.TrimSpace(string(b[:n])))
}

// command is a PostgreSQL program of binDir run as the service's OS user,
// in the upgrade's work directory.
func (u *upgradeRun) command(ctx context.Context, binDir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, name), args...)
	cmd.Dir = u.work
	if _, err := os.Stat(u.work); err != nil {
		cmd.Dir = "/"
	}
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", "LC_ALL=C", "PGCONNECT_TIMEOUT=10"}
	// pg_upgrade dies with dbcloud: the next attempt undoes what it left
	// (undoInterrupted), which one still running would race.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.owner, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// run runs a PostgreSQL program of binDir as the service's OS user in the
// upgrade directory; its output goes to the service's log.
func (u *upgradeRun) run(ctx context.Context, binDir, name string, args ...string) (string, error) {
	out, err := u.command(ctx, binDir, name, args...).CombinedOutput()
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l = strings.TrimRight(l, " "); l != "" {
			u.note("LOG", name+": "+l)
		}
	}
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", name, err, lastLines(string(out), 20))
	}
	return string(out), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// upgradeConf is the configuration pg_upgrade's servers (and the
// rehearsal's) run with, written into each data directory: the service's
// preloaded libraries (TimescaleDB must be loaded on both sides), no TCP,
// the upgrade directory's socket, and peer access for the service's OS
// user as the superuser pg_upgrade connects as.
func (u *upgradeRun) upgradeConf() string {
	libs := postgres.PreloadLibraries(u.spec.Settings["shared_preload_libraries"])
	return strings.Join([]string{
		"# Written by dbcloud for a major version upgrade of " + u.svc.ID,
		"listen_addresses = ''",
		"port = " + strconv.Itoa(upgradePort),
		"unix_socket_directories = " + postgres.QuoteLiteral(filepath.Join(u.work, "sock")),
		"hba_file = " + postgres.QuoteLiteral(filepath.Join(u.work, "pg_hba.conf")),
		"ident_file = " + postgres.QuoteLiteral(filepath.Join(u.work, "pg_ident.conf")),
		"shared_preload_libraries = " + postgres.QuoteLiteral(libs),
		"max_connections = 20",
		"shared_buffers = '32MB'",
		"dynamic_shared_memory_type = posix",
		"archive_mode = off",
		"logging_collector = off",
		"timescaledb.telemetry_level = off",
		"",
	}, "\n")
}

// prepareWork makes the upgrade directory afresh, the service's OS
// user's, with the access files upgradeConf names.
func (u *upgradeRun) prepareWork() error {
	if err := os.RemoveAll(u.work); err != nil {
		return err
	}
	if err := u.rt.instances.MakeServerDir(u.spec, u.work); err != nil {
		return err
	}
	if err := u.rt.instances.MakeServerDir(u.spec, filepath.Join(u.work, "sock")); err != nil {
		return err
	}
	user := "postgres"
	if u.spec.Owner != nil {
		user = u.spec.Owner.Name
	} else if name := postgres.CurrentOSUser(); name != "root" {
		user = name
	}
	files := map[string]string{
		"pg_hba.conf":   "local all all peer map=upgrade\n",
		"pg_ident.conf": "upgrade " + user + " postgres\n",
	}
	for name, text := range files {
		if err := u.rt.instances.WriteServerFile(u.spec, filepath.Join(u.work, name), []byte(text), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// initCluster makes an empty cluster of the target version in dir, as
// the pool's clusters are made, with upgradeConf and the WAL segment size
// of the cluster at from, as pg_upgrade requires (services made before
// the pool's clusters had smaller segments have 16 MiB ones).
func (u *upgradeRun) initCluster(ctx context.Context, dir, from string) error {
	segMB, err := u.walSegmentMB(ctx, u.fromBin, from)
	if err != nil {
		return err
	}
	if err := u.rt.instances.MakeServerDir(u.spec, dir); err != nil {
		return err
	}
	// NOCOW like the data directory it is cloned from (btrfs clones only
	// between files alike), and before initdb so every directory inherits it.
	if err := volume.NoCOWDir(dir); err != nil {
		return err
	}
	if _, err := u.run(ctx, u.toBin, "initdb", "-D", dir, "-N", "-k", "-U", "postgres", "-A", "peer",
		"-E", "UTF8", "--locale=C", "--wal-segsize="+strconv.Itoa(segMB)); err != nil {
		return err
	}
	return u.writeConf(dir)
}

// walSegmentMB reads the WAL segment size of the cluster at pgdata (of
// the version in binDir) from its control file, in MiB.
func (u *upgradeRun) walSegmentMB(ctx context.Context, binDir, pgdata string) (int, error) {
	out, err := u.command(ctx, binDir, "pg_controldata", "-D", pgdata).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pg_controldata %s: %w: %s", pgdata, err, lastLines(string(out), 5))
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "Bytes per WAL segment:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 1<<20 {
				return n >> 20, nil
			}
		}
	}
	return 0, fmt.Errorf("pg_controldata %s: no WAL segment size in %q", pgdata, lastLines(string(out), 40))
}

func (u *upgradeRun) writeConf(pgdata string) error {
	return u.rt.instances.WriteServerFile(u.spec, filepath.Join(pgdata, "postgresql.conf"), []byte(u.upgradeConf()), 0o600)
}

// pgUpgrade runs pg_upgrade from old to new in mode ("--check",
// "--link" or "--clone").
func (u *upgradeRun) pgUpgrade(ctx context.Context, oldData, newData, mode string) error {
	out, err := u.run(ctx, u.toBin, "pg_upgrade", mode, "-b", u.fromBin, "-B", u.toBin, "-d", oldData, "-D", newData,
		"-U", "postgres", "-s", filepath.Join(u.work, "sock"), "-p", strconv.Itoa(upgradePort), "-P", strconv.Itoa(upgradePort+1),
		"-j", "2")
	if err != nil {
		u.rt.cfg.Logger.Error("pg_upgrade failed", "service", u.svc.ID, "mode", mode, "output", lastLines(out, 40))
		return &dbcloud.UpgradeFailed{Step: "pg_upgrade " + mode, Reason: pgUpgradeReason(out)}
	}
	return nil
}

// pgUpgradeReason is what a user reads of a pg_upgrade that failed: the
// check that failed and pg_upgrade's explanation, without the host paths
// of the files it lists the objects in.
func pgUpgradeReason(out string) string {
	// Progress lines end in a carriage return when they are rewritten.
	lines := strings.FieldsFunc(out, func(r rune) bool { return r == '\n' || r == '\r' })
	check, from := "", 0
	for i, l := range lines {
		l = strings.TrimSpace(l)
		if (strings.HasPrefix(l, "Checking ") || strings.HasPrefix(l, "Performing ")) && !strings.HasSuffix(l, " ok") {
			check, from = strings.TrimSpace(strings.TrimSuffix(l, "fatal")), i+1
		}
	}
	var parts []string
	if check != "" {
		parts = append(parts, check+":")
	}
	for _, l := range lines[from:] {
		l = strings.TrimSpace(l)
		switch {
		case l == "", strings.HasPrefix(l, "/"), strings.HasSuffix(l, "in the file:"):
			continue
		case strings.HasPrefix(l, "Failure, exiting"):
			break
		default:
			parts = append(parts, l)
			continue
		}
		break
	}
	reason := strings.Join(parts, " ")
	if len(reason) > 600 {
		reason = reason[:600] + "..."
	}
	if reason == "" {
		return "pg_upgrade failed"
	}
	return reason
}

// writeLog appends what the upgrade did to the service's log, as the
// jsonlog lines its servers write, in a file of its own in the primary's
// log directory.
func (u *upgradeRun) writeLog() {
	if len(u.log) == 0 {
		return
	}
	var b strings.Builder
	for _, l := range u.log {
		rec, _ := json.Marshal(map[string]any{
			"timestamp": l.at.UTC().Format("2006-01-02 15:04:05.000 MST"), "error_severity": l.severity,
			"message": l.text, "backend_type": "pg_upgrade",
		})
		b.Write(rec)
		b.WriteByte('\n')
	}
	at := u.began.UTC()
	var path string
	for {
		path = filepath.Join(u.spec.LogDir(), "postgresql-"+at.Format("2006-01-02_150405")+".json")
		if _, err := tenantfs.Lstat(path); err != nil {
			break
		}
		at = at.Add(-time.Second)
	}
	if err := u.rt.instances.WriteServerFile(u.spec, path, []byte(b.String()), 0o600); err != nil {
		u.rt.cfg.Logger.Warn("upgrade log not written", "service", u.svc.ID, "error", err)
	}
	u.log = nil
}

// marker records how far the service's own data got.
func (u *upgradeRun) marker(phase string) error {
	info, _ := json.Marshal(map[string]any{"from": u.from.Major, "to": u.to.Major, "phase": phase, "at": time.Now().UTC()})
	if err := atomicfile.Write(filepath.Join(u.rt.serviceDir(u.svc.ID), upgradeMarker), info, 0o600); err != nil {
		return err
	}
	return atomicfile.SyncDir(u.rt.serviceDir(u.svc.ID))
}
