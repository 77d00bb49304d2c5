package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"dbcloud"
	"dbcloud/internal/atomicfile"
	"dbcloud/internal/supervise"
	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/backup"
	"dbcloud/runtime/local/postgres"

	"github.com/jackc/pgx/v5"
)

// rehearse runs the whole upgrade on a throwaway copy of the running
// primary, and checks that every database of the result answers.
func (u *upgradeRun) rehearse(ctx context.Context) error {
	// The copy is of the running primary: after a crash it may be down.
	if err := u.rt.instances.Ensure(ctx, u.spec); err != nil {
		return err
	}
	if err := u.prepareWork(); err != nil {
		return err
	}
	defer os.RemoveAll(u.work)
	oldData, newData := filepath.Join(u.work, "old"), filepath.Join(u.work, "new")
	snap, err := u.rt.backups.OnlineBackup(ctx, u.spec, oldData, "dbcloud upgrade rehearsal "+u.svc.ID, backup.CopyOptions{Owner: u.owner})
	if err != nil {
		return err
	}
	if err := u.writeConf(oldData); err != nil {
		return err
	}
	// Recovered to the copy's end and shut down cleanly, as pg_upgrade
	// wants its source.
	if err := u.startCopy(ctx, u.fromBin, oldData); err != nil {
		return err
	}
	if err := u.stopCopy(ctx, u.fromBin, oldData); err != nil {
		return err
	}
	u.done("rehearsal_copy", fmt.Sprintf("copied the running data (%d MiB)", snap.Bytes>>20))
	if err := u.initCluster(ctx, newData, oldData); err != nil {
		return err
	}
	if err := u.pgUpgrade(ctx, oldData, newData, "--check"); err != nil {
		return err
	}
	u.done("rehearsal_check", "pg_upgrade --check passed")
	if err := u.pgUpgrade(ctx, oldData, newData, "--link"); err != nil {
		return err
	}
	u.done("rehearsal_upgrade", "pg_upgrade of the copy succeeded")
	if err := u.startCopy(ctx, u.toBin, newData); err != nil {
		return &dbcloud.UpgradeFailed{Step: "rehearsal start", Reason: "the upgraded copy did not start on PostgreSQL " + strconv.Itoa(u.to.Major)}
	}
	defer u.stopCopy(context.WithoutCancel(ctx), u.toBin, newData)
	checked, err := u.verifyCopy(ctx)
	if err != nil {
		return err
	}
	u.done("rehearsal_verify", checked)
	return nil
}

func (u *upgradeRun) startCopy(ctx context.Context, binDir, pgdata string) error {
	_, err := u.run(ctx, binDir, "pg_ctl", "-D", pgdata, "-w", "-t", "600", "-l", pgdata+".log", "start")
	if err != nil {
		if b, rerr := os.ReadFile(pgdata + ".log"); rerr == nil {
			u.note("LOG", "server: "+lastLines(string(b), 20))
		}
	}
	return err
}

func (u *upgradeRun) stopCopy(ctx context.Context, binDir, pgdata string) error {
	_, err := u.run(ctx, binDir, "pg_ctl", "-D", pgdata, "-w", "-t", "600", "-m", "fast", "stop")
	return err
}

// psql runs one statement on the rehearsal's server as the superuser.
func (u *upgradeRun) psql(ctx context.Context, db, sql string) (string, error) {
	return u.run(ctx, u.toBin, "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", filepath.Join(u.work, "sock"),
		"-p", strconv.Itoa(upgradePort), "-U", "postgres", "-d", db, "-c", sql)
}

// verifyCopy updates every extension in every database of the upgraded
// copy and runs a query in each; it reports what it checked.
func (u *upgradeRun) verifyCopy(ctx context.Context) (string, error) {
	out, err := u.psql(ctx, "postgres", "SELECT datname FROM pg_database WHERE datallowconn ORDER BY 1")
	if err != nil {
		return "", err
	}
	dbs := strings.Fields(out)
	exts := 0
	for _, db := range dbs {
		out, err := u.psql(ctx, db, "SELECT extname FROM pg_extension WHERE extname <> 'plpgsql' ORDER BY 1")
		if err != nil {
			return "", err
		}
		for _, ext := range strings.Fields(out) {
			if _, err := u.psql(ctx, db, "ALTER EXTENSION "+postgres.QuoteIdent(ext)+" UPDATE"); err != nil {
				return "", &dbcloud.UpgradeFailed{Step: "rehearsal extensions", Reason: fmt.Sprintf("ALTER EXTENSION %s UPDATE failed in database %s", ext, db)}
			}
			exts++
		}
		if _, err := u.psql(ctx, db, "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'i', 'm')"); err != nil {
			return "", &dbcloud.UpgradeFailed{Step: "rehearsal query", Reason: "database " + db + " did not answer on the upgraded copy"}
		}
	}
	return fmt.Sprintf("%d databases answer on PostgreSQL %d; %d extensions updated", len(dbs), u.to.Major, exts), nil
}

// upgradeService upgrades the service's own data, after a snapshot:
// stopped, pg_upgrade into pgdata.new, swapped into place. On an error
// the caller puts the old data back (undoInterrupted).
func (u *upgradeRun) upgradeService(ctx context.Context) error {
	snap, err := u.rt.backups.Take(ctx, u.rt.serviceDir(u.svc.ID), u.spec)
	if err != nil {
		return err
	}
	u.done("snapshot", "snapshot "+snap.Name+" of PostgreSQL "+strconv.Itoa(u.from.Major)+" taken: the way back")
	if err := u.prepareWork(); err != nil {
		return err
	}
	defer os.RemoveAll(u.work)
	// Everything that does not need the service stopped comes first, so
	// the downtime is pg_upgrade's alone: the new cluster made, and a
	// checkpoint that leaves the shutdown little to write.
	pgdata, newData := u.spec.PGData(), u.newData()
	if err := os.RemoveAll(newData); err != nil {
		return err
	}
	if err := u.initCluster(ctx, newData, pgdata); err != nil {
		return err
	}
	if err := u.rt.instances.Exec(ctx, u.spec, "postgres", "CHECKPOINT"); err != nil {
		return err
	}
	if err := u.marker("upgrading"); err != nil {
		return err
	}
	if err := u.stopService(ctx); err != nil {
		return err
	}
	u.done("stop", "the service's servers are stopped")
	if err := u.writeConf(pgdata); err != nil {
		return err
	}
	mode := "--link"
	if u.rt.volumes != nil && u.rt.volumes.Filesystem().Reflink {
		mode = "--clone"
	}
	// pg_upgrade runs its consistency checks again before it changes
	// anything: what changed since the rehearsal is checked too.
	if err := u.pgUpgrade(ctx, pgdata, newData, mode); err != nil {
		return err
	}
	u.done("pg_upgrade", "pg_upgrade "+mode+" succeeded")
	// The swap: a crash between the renames leaves pgdata missing,
	// which undoInterrupted repairs from the old one.
	if err := os.Rename(pgdata, u.oldData()); err != nil {
		return err
	}
	if err := os.Rename(newData, pgdata); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(u.spec.Dir); err != nil {
		return err
	}
	return u.marker("swapped")
}

func (u *upgradeRun) newData() string { return u.spec.PGData() + ".new" }
func (u *upgradeRun) oldData() string {
	return u.spec.PGData() + ".pg" + strconv.Itoa(u.from.Major)
}

// stopService stops the standbys, then the primary, whose exit is no
// failure now, and the metrics session that would hold up its shutdown.
func (u *upgradeRun) stopService(ctx context.Context) error {
	u.rt.sessions.close(ctx, u.svc.ID)
	for _, s := range u.standbys() {
		if err := u.rt.stopInstance(ctx, s, 30*time.Second); err != nil {
			return err
		}
	}
	u.rt.unwatchPrimary(u.svc.ID)
	return u.rt.stopInstance(ctx, u.spec, 60*time.Second)
}

// standbys are the specs of the service's HA standbys (none without HA).
func (u *upgradeRun) standbys() []postgres.Spec {
	if !u.rt.isHA(u.svc) {
		return nil
	}
	st, err := u.rt.loadHA(u.svc.ID)
	if err != nil || st == nil {
		return nil
	}
	base, err := u.rt.instanceBase(u.svc)
	if err != nil {
		return nil
	}
	var out []postgres.Spec
	for _, n := range st.Members {
		if n != st.Primary {
			out = append(out, u.rt.haSpec(u.svc, base, st, n))
		}
	}
	return out
}

// undoInterrupted puts the old version's data back where an interrupted
// or failed attempt left it: the half-made new data directory removed,
// the old one back in place and its pg_control, which pg_upgrade --link
// renames so the old server cannot start by mistake, restored. Data the
// new version has already run on is never touched here (the caller sees
// PG_VERSION first).
func (u *upgradeRun) undoInterrupted(ctx context.Context) error {
	pgdata := u.spec.PGData()
	// A pg_upgrade killed with dbcloud leaves the servers it started
	// running: on the copies, on the new cluster and on the service's
	// own data (with pg_upgrade's settings, not the service's).
	for _, dir := range []string{filepath.Join(u.work, "old"), filepath.Join(u.work, "new"), u.newData()} {
		if err := u.stopStray(ctx, dir); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(u.rt.serviceDir(u.svc.ID), upgradeMarker)); err == nil {
		u.rt.cfg.Logger.Warn("upgrade: putting the old data back", "service", u.svc.ID, "from", u.from.Major, "to", u.to.Major)
		if err := u.rt.stopInstance(ctx, u.spec, 30*time.Second); err != nil {
			return err
		}
	}
	if _, err := tenantfs.Lstat(filepath.Join(pgdata, "PG_VERSION")); errors.Is(err, fs.ErrNotExist) {
		if _, oerr := os.Stat(u.oldData()); oerr == nil {
			_ = u.rt.stopInstance(ctx, u.spec, 30*time.Second)
			if err := os.RemoveAll(pgdata); err != nil {
				return err
			}
			if err := os.Rename(u.oldData(), pgdata); err != nil {
				return err
			}
		}
	}
	if err := os.RemoveAll(u.newData()); err != nil {
		return err
	}
	ctl := filepath.Join(pgdata, "global", "pg_control")
	if _, err := tenantfs.Lstat(ctl); errors.Is(err, fs.ErrNotExist) {
		if _, oerr := tenantfs.Lstat(ctl + ".old"); oerr == nil {
			if err := os.Rename(ctl+".old", ctl); err != nil {
				return err
			}
		}
	}
	_ = os.RemoveAll(u.work)
	return atomicfile.SyncDir(u.spec.Dir)
}

// stopStray stops a postmaster that serves pgdata, which only an
// interrupted upgrade leaves (immediate: the data is thrown away or
// pg_upgrade runs again from the start).
func (u *upgradeRun) stopStray(ctx context.Context, pgdata string) error {
	pf, err := postgres.ReadPidFile(pgdata)
	if err != nil || syscall.Kill(pf.PID, 0) != nil {
		return nil
	}
	v, err := dataVersion(pgdata)
	bin, ok := u.rt.binDirs[v]
	if err != nil || !ok {
		return fmt.Errorf("a server of unknown version runs on %s", pgdata)
	}
	u.rt.cfg.Logger.Warn("upgrade: stopping a server an interrupted attempt left", "service", u.svc.ID, "pgdata", pgdata, "pid", pf.PID)
	_, err = u.run(ctx, bin, "pg_ctl", "-D", pgdata, "-w", "-t", "60", "-m", "immediate", "stop")
	return err
}

// finish starts the primary on the new version and completes what
// follows: extensions updated, the old data and the standbys' copies
// removed (the ensure copies them again from the new primary), the old
// version's snapshots set aside, ANALYZE in stages in the background.
// A primary that does not start puts the old data back, while it is there.
func (u *upgradeRun) finish(ctx context.Context) error {
	spec := u.spec
	spec.BinDir = u.toBin
	if err := u.rt.instances.Ensure(ctx, spec); err != nil {
		if _, oerr := os.Stat(u.oldData()); oerr == nil {
			_ = u.rt.stopInstance(ctx, spec, 30*time.Second)
			if rerr := os.Rename(spec.PGData(), u.newData()); rerr == nil {
				return u.failed(ctx, "start", &dbcloud.UpgradeFailed{Step: "start", Reason: "the upgraded primary did not start on PostgreSQL " + strconv.Itoa(u.to.Major)})
			}
		}
		return err
	}
	u.done("start", "the primary runs PostgreSQL "+u.to.Full+" on the same endpoint")
	n, failed, err := u.updateExtensions(ctx, spec)
	if err != nil {
		return err
	}
	detail := fmt.Sprintf("%d extensions updated", n)
	if len(failed) > 0 {
		detail += "; not updated (the operator's logs say why): " + strings.Join(failed, ", ")
	}
	u.done("extensions", detail)
	if err := os.RemoveAll(u.oldData()); err != nil {
		return err
	}
	for _, s := range u.standbys() {
		if err := u.rt.stopInstance(ctx, s, 30*time.Second); err != nil {
			return err
		}
		if err := os.RemoveAll(s.PGData()); err != nil {
			return err
		}
	}
	if err := u.setAsideSnapshots(); err != nil {
		return err
	}
	u.analyzeInBackground(spec)
	u.done("analyze", "vacuumdb --analyze-in-stages runs in the background")
	if err := os.Remove(filepath.Join(u.rt.serviceDir(u.svc.ID), upgradeMarker)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// updateExtensions runs ALTER EXTENSION ... UPDATE for every extension
// in every database of the running primary, each first in a session of
// its own: TimescaleDB refuses an update once its old version is loaded
// in the session. It reports how many it updated and what failed; a
// failure does not undo the upgrade (the rehearsal ran the same updates
// on the same data), it is said in the step.
func (u *upgradeRun) updateExtensions(ctx context.Context, spec postgres.Spec) (int, []string, error) {
	dbs, err := u.rt.queryStrings(ctx, spec, "postgres", "SELECT datname FROM pg_database WHERE datallowconn ORDER BY 1")
	if err != nil {
		return 0, nil, err
	}
	n := 0
	var failed []string
	for _, db := range dbs {
		exts, err := u.rt.queryStrings(ctx, spec, db, "SELECT extname FROM pg_extension WHERE extname <> 'plpgsql' ORDER BY 1")
		if err != nil {
			return n, failed, err
		}
		for _, e := range exts {
			if err := u.updateExtension(ctx, spec, db, e); err != nil {
				u.rt.cfg.Logger.Warn("extension not updated after upgrade", "service", u.svc.ID, "database", db, "extension", e, "error", err)
				failed = append(failed, e+" in "+db)
				continue
			}
			n++
		}
	}
	return n, failed, nil
}

// updateExtension updates one extension, first in a session of its own,
// committing locally: the synchronous standbys are copied again only
// after the upgrade, by the ensure.
func (u *upgradeRun) updateExtension(ctx context.Context, spec postgres.Spec, db, ext string) error {
	conn, err := u.rt.instances.ConnectWith(ctx, spec, db, map[string]string{"synchronous_commit": "local"})
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "ALTER EXTENSION "+postgres.QuoteIdent(ext)+" UPDATE")
	return err
}

// queryStrings reads one text column from a session of its own.
func (rt *Runtime) queryStrings(ctx context.Context, spec postgres.Spec, db, sql string) ([]string, error) {
	conn, err := rt.instances.Connect(ctx, spec, db)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return connStrings(ctx, conn, sql)
}

// connStrings reads one text column on conn.
func connStrings(ctx context.Context, conn *pgx.Conn, sql string, args ...any) ([]string, error) {
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// setAsideSnapshots moves the old version's snapshots out of the way of
// forks and point-in-time restores, which would start them on the new
// version's binaries; the runtime's schedule takes a new one at once,
// since none is left. They stay on disk beside, as the way back.
func (u *upgradeRun) setAsideSnapshots() error {
	dir := backup.SnapshotsDir(u.rt.serviceDir(u.svc.ID))
	aside := dir + "-pg" + strconv.Itoa(u.from.Major)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.RemoveAll(aside); err != nil {
		return err
	}
	return os.Rename(dir, aside)
}

// analyzeInBackground gives the new version's planner statistics, which
// pg_upgrade does not carry over, without holding the upgrade up.
func (u *upgradeRun) analyzeInBackground(spec postgres.Spec) {
	u.rt.background.Go(supervise.Task{Name: "analyze after upgrade", Attrs: []any{"service", u.svc.ID}}, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(u.toBin, "vacuumdb"), "--all", "--analyze-in-stages",
			"-h", spec.RunDir(), "-p", strconv.Itoa(spec.Port), "-U", "postgres")
		cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", "PGCONNECT_TIMEOUT=10"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			u.rt.cfg.Logger.Warn("analyze after upgrade failed", "service", u.svc.ID, "error", err, "output", lastLines(string(out), 5))
			return
		}
		u.rt.cfg.Logger.Info("analyze after upgrade done", "service", u.svc.ID)
	})
}
