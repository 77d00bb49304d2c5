package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"dbcloud"
	"dbcloud/runtime/local/backup"
	"dbcloud/runtime/local/postgres"
)

// A BLUE_GREEN upgrade (decisions.md section 11) makes a cluster on the
// target version as another instance of the service ("green"), copies the
// roles and the schema into it, and fills it by logical replication from
// the primary ("blue"): a publication for all tables in each database, a
// subscription in the new cluster. Schema changes on blue are refused by
// an event trigger meanwhile, and blue serves as it did: nothing of it
// restarts before the switch (logicalwal.go). The switch stops new
// sessions reaching blue, ends blue's sessions, waits until green has
// applied blue's last WAL, copies the sequences, and moves the endpoint to
// green. A service behind its endpoint proxy (HA) has new connections
// held there and the proxy pointed at green. A service whose primary
// listens on the endpoint itself (Direct) has them held in blue's listen
// queue (bluegreen_hold.go); then blue stops and the proxy, started
// beforehand bound to nothing, takes the endpoint's address and forwards
// to green: the service has the HA layout from then on. Blue is kept,
// stopped; bluegreen.json says how far it got, so a crash of dbcloud
// finishes a switch that was made or undoes one that was not.
const (
	blueGreenFile = "bluegreen.json"
	// bgName names what the upgrade makes in the clusters: the
	// publication, the subscriptions' prefix, the schema of the DDL
	// trigger's function, the replication role.
	bgName = "dbcloud_upgrade"
	// bgCatchUp bounds the wait for green at the switch, while new
	// connections are held: past it the switch is undone.
	bgCatchUp = 10 * time.Second
	// bgEndSessions bounds the wait for blue's sessions to end at the
	// switch: one that takes longer fails the switch, which is undone.
	bgEndSessions = 5 * time.Second
	// bgServeBlue bounds putting blue back on the endpoint when dbcloud
	// stops in the middle of an attempt.
	bgServeBlue = 30 * time.Second
	// bgCopyLimit bounds the initial copy.
	bgCopyLimit = 6 * time.Hour
)

// Phases of a BLUE_GREEN upgrade, in bluegreen.json.
const (
	bgCopying  = "copying"  // green is made and filled; blue serves
	bgSwitched = "switched" // green has every write: it serves from now on
	bgKept     = "kept"     // blue is stopped and kept for a ROLLBACK
	bgRolling  = "rolling_back"
)

// bgState is a BLUE_GREEN upgrade's record, written atomically.
type bgState struct {
	From  int    `json:"from"`
	To    int    `json:"to"`
	Phase string `json:"phase"`
	// Blue and Green are instance numbers: DATA/services/<id>/<n>.
	Blue      int `json:"blue"`
	Green     int `json:"green"`
	GreenPort int `json:"green_port"`
	// Direct says blue listened on the endpoint itself, without the
	// proxy, when the attempt began.
	Direct bool `json:"direct,omitempty"`
	// Password is the replication role's, which the subscriptions use.
	Password string `json:"password,omitempty"`
	// FullIdentity lists, per database, the tables without a key that
	// the upgrade gave REPLICA IDENTITY FULL (an UPDATE of them is
	// refused under a publication otherwise), to put back.
	FullIdentity map[string][]string `json:"full_identity,omitempty"`
	// RolledBack says a ROLLBACK has put the old version's archive and
	// snapshots back: a second pass must not swap them again.
	RolledBack bool `json:"rolled_back,omitempty"`
}

func (rt *Runtime) bgPath(id string) string { return filepath.Join(rt.serviceDir(id), blueGreenFile) }

func (rt *Runtime) loadBG(id string) (*bgState, error) { return readState[bgState](rt.bgPath(id)) }

func (rt *Runtime) saveBG(id string, st *bgState) error { return writeState(rt.bgPath(id), st) }

// bgRun is one call of UpgradeBlueGreen or RollBackUpgrade.
type bgRun struct {
	rt       *Runtime
	svc      *dbcloud.Service
	from, to dbcloud.PGVersion
	base     postgres.Spec
	step     func(dbcloud.UpgradeStep)
}

func (rt *Runtime) newBG(ctx context.Context, svc *dbcloud.Service, from, to int, step func(dbcloud.UpgradeStep)) (*bgRun, error) {
	f, ok := dbcloud.FindPGVersion(from, rt.versions)
	t, ok2 := dbcloud.FindPGVersion(to, rt.versions)
	if !ok || !ok2 {
		return nil, &dbcloud.UpgradeFailed{Step: "accept", Reason: fmt.Sprintf("this host runs PostgreSQL %s", dbcloud.ListPGVersions(rt.versions))}
	}
	base, err := rt.preparedBase(ctx, svc)
	if err != nil {
		return nil, err
	}
	return &bgRun{rt: rt, svc: svc, from: f, to: t, base: base, step: step}, nil
}

func (b *bgRun) done(name, detail string) {
	b.rt.cfg.Logger.Info("upgrade step", "service", b.svc.ID, "method", "BLUE_GREEN", "step", name, "detail", detail)
	b.step(dbcloud.UpgradeStep{Name: name, Detail: detail})
}

// UpgradeBlueGreen upgrades the service onto a new cluster filled by
// logical replication. See dbcloud.BlueGreenUpgrader.
func (rt *Runtime) UpgradeBlueGreen(ctx context.Context, svc *dbcloud.Service, step func(dbcloud.UpgradeStep)) (string, error) {
	b, err := rt.newBG(ctx, svc, svc.Spec.PGVersion, svc.UpgradeTo, step)
	if err != nil {
		return "", err
	}
	st, err := rt.loadBG(svc.ID)
	if err != nil {
		return "", err
	}
	if st != nil && st.To == b.to.Major && (st.Phase == bgSwitched || st.Phase == bgKept) {
		// A crash after the switch: green has every write; finish.
		return b.to.Full, b.finishSwitch(ctx, st)
	}
	if st != nil && st.Phase == bgCopying {
		b.rt.cfg.Logger.Warn("blue/green upgrade: undoing an interrupted attempt", "service", svc.ID)
		if err := b.undo(ctx, st); err != nil {
			return "", err
		}
	}
	if st, err = b.copy(ctx); err != nil {
		return "", b.failed(ctx, st, "copy", err)
	}
	if err := b.switchOver(ctx, st); err != nil {
		return "", b.failed(ctx, st, "switch", err)
	}
	return b.to.Full, b.finishSwitch(ctx, st)
}

// failed undoes an attempt that stopped before the switch and returns the
// UpgradeFailed the engine shows; a cancelled context is no failure (the
// next attempt undoes what this one left, from bluegreen.json).
func (b *bgRun) failed(ctx context.Context, st *bgState, phase string, err error) error {
	if ctx.Err() != nil {
		// The rest of the undo is the next attempt's, but blue serves
		// meanwhile: held or sealed, the service would be down for as
		// long as dbcloud is.
		if st != nil {
			serve, cancel := context.WithTimeout(context.WithoutCancel(ctx), bgServeBlue)
			defer cancel()
			if ha, herr := b.ha(); herr != nil {
				b.rt.cfg.Logger.Warn("blue/green upgrade cancelled; the old cluster may still be held", "service", b.svc.ID, "error", herr)
			} else if _, serr := b.serveBlue(serve, ha, st); serr != nil {
				b.rt.cfg.Logger.Warn("blue/green upgrade cancelled; the old cluster may still be held", "service", b.svc.ID, "error", serr)
			}
		}
		return ctx.Err()
	}
	var f *dbcloud.UpgradeFailed
	if !errors.As(err, &f) {
		f = &dbcloud.UpgradeFailed{Step: phase, Reason: "an internal error; the operator's logs have the details"}
	}
	b.rt.cfg.Logger.Error("blue/green upgrade failed", "service", b.svc.ID, "step", f.Step, "error", err)
	if st != nil {
		if uerr := b.undo(context.WithoutCancel(ctx), st); uerr != nil {
			return fmt.Errorf("blue/green upgrade of %s failed (%w) and was not undone: %w", b.svc.ID, err, uerr)
		}
	}
	b.step(dbcloud.UpgradeStep{Name: "rolled_back", Detail: f.Step + " failed: " + f.Reason})
	return f
}

// ha returns the service's HA state, the primary alone when it has none.
func (b *bgRun) ha() (*haState, error) {
	ha, err := b.rt.loadHA(b.svc.ID)
	if err != nil || ha != nil {
		return ha, err
	}
	return &haState{Primary: 0, Members: []int{0}, instancePorts: newInstancePorts()}, nil
}

// blueSpec is the old cluster's spec, as the primary it was; logical
// while it may hold the upgrade's logical slots, which a server with a
// lower wal_level refuses to start with. Until the switch gives it an
// internal port, a Direct blue is the service's own spec.
func (b *bgRun) blueSpec(ha *haState, st *bgState, logical bool) postgres.Spec {
	if ha.Ports[st.Blue] == 0 {
		s := b.base
		s.Settings = maps.Clone(s.Settings)
		if logical {
			s.Settings["wal_level"] = "logical"
		}
		s.BinDir = b.rt.binDirs[st.From]
		return s
	}
	h := *ha
	h.Primary, h.Members, h.Sync, h.SyncCount, h.Logical = st.Blue, []int{st.Blue}, nil, 0, logical
	s := b.rt.haSpec(b.svc, b.base, &h, st.Blue)
	s.BinDir = b.rt.binDirs[st.From]
	return s
}

// greenSpec is the new cluster's spec. Until the switch it archives its
// WAL beside the service's archive: the two clusters' segment names
// would collide.
func (b *bgRun) greenSpec(ha *haState, st *bgState, final bool) postgres.Spec {
	h := *ha
	h.Ports = maps.Clone(ha.Ports)
	h.Ports[st.Green] = st.GreenPort
	h.Primary, h.Members, h.Sync, h.SyncCount, h.Logical = st.Green, []int{st.Green}, nil, 0, false
	s := b.rt.haSpec(b.svc, b.base, &h, st.Green)
	s.BinDir = b.rt.binDirs[st.To]
	if !final {
		s.ArchiveDir = b.greenArchive(st)
	}
	return s
}

func (b *bgRun) greenArchive(st *bgState) string {
	return b.rt.archiveDir(b.svc.ID) + ".pg" + strconv.Itoa(st.To)
}

func (b *bgRun) target(s postgres.Spec) string {
	return net.JoinHostPort(b.rt.cfg.Host, strconv.Itoa(s.Port))
}

// behindProxy puts the service the HA way with its primary writing
// logical WAL: the primary moves to an internal port (a restart) and the
// proxy takes the endpoint, so that the switch can hold connections there.
func (b *bgRun) behindProxy(ctx context.Context) (*haState, error) {
	ha, err := b.ha()
	if err != nil {
		return nil, err
	}
	if !ha.Logical || !b.rt.proxyRunning(b.svc.ID) {
		ha.Logical = true
		if err := b.rt.saveHA(b.svc.ID, ha); err != nil {
			return nil, err
		}
		if _, err := b.rt.ensureHA(ctx, b.svc); err != nil {
			return nil, err
		}
		b.done("proxy", "the endpoint is served by its proxy; the primary writes logical WAL")
	}
	return b.rt.loadHA(b.svc.ID)
}

// logicalDirect readies a primary that listens on the endpoint itself:
// one that does not write logical WAL yet (it has run since before
// services on older versions were given it) restarts into it, in place.
func (b *bgRun) logicalDirect(ctx context.Context) (*haState, error) {
	ha, err := b.ha()
	if err != nil {
		return nil, err
	}
	level, err := b.rt.queryStrings(ctx, b.base, "postgres", "SHOW wal_level")
	if err != nil {
		return nil, err
	}
	if len(level) == 1 && level[0] == "logical" {
		return ha, nil
	}
	if err := b.rt.markLogicalWAL(b.svc.ID); err != nil {
		return nil, err
	}
	b.base.Settings = maps.Clone(b.base.Settings)
	b.base.Settings["wal_level"] = "logical"
	if err := b.rt.instances.Ensure(ctx, b.base); err != nil {
		return nil, err
	}
	b.done("wal_level", "the primary restarted once to write logical WAL")
	return ha, nil
}

// copy makes green and fills it; it returns once green streams blue's
// changes with every table copied.
func (b *bgRun) copy(ctx context.Context) (*bgState, error) {
	direct := !b.rt.isHA(b.svc)
	var ha *haState
	var err error
	if direct {
		ha, err = b.logicalDirect(ctx)
	} else {
		ha, err = b.behindProxy(ctx)
	}
	if err != nil {
		return nil, err
	}
	st := &bgState{From: b.from.Major, To: b.to.Major, Phase: bgCopying, Blue: ha.Primary, Direct: direct}
	blue := b.blueSpec(ha, st, true)
	if err := b.refuseTimescale(ctx, blue); err != nil {
		return nil, err
	}
	for n := 0; ; n++ {
		if _, err := os.Stat(filepath.Join(b.rt.serviceDir(b.svc.ID), strconv.Itoa(n))); !slices.Contains(ha.Members, n) && errors.Is(err, fs.ErrNotExist) {
			st.Green = n
			break
		}
	}
	if st.GreenPort, err = b.rt.freeInternalPort(ha); err != nil {
		return nil, err
	}
	if st.Password, err = randomPassword(); err != nil {
		return nil, err
	}
	// Recorded before anything is made, so that undo finds it all.
	if err := b.rt.saveBG(b.svc.ID, st); err != nil {
		return st, err
	}
	green := b.greenSpec(ha, st, false)
	if err := b.rt.instances.Ensure(ctx, green); err != nil {
		return st, err
	}
	b.done("new_cluster", "a PostgreSQL "+b.to.Full+" cluster runs beside the service")
	dbs, err := b.prepareBlue(ctx, blue, st)
	if err != nil {
		return st, err
	}
	if err := b.rt.saveBG(b.svc.ID, st); err != nil {
		return st, err
	}
	if err := b.copySchema(ctx, blue, green, dbs); err != nil {
		return st, err
	}
	b.done("schema", fmt.Sprintf("roles and the schema of %d databases copied; schema changes are refused until the switch", len(dbs)))
	if err := b.subscribe(ctx, blue, green, st, dbs); err != nil {
		return st, err
	}
	if err := b.waitCopied(ctx, green, dbs); err != nil {
		return st, err
	}
	b.done("copy", fmt.Sprintf("every table of %d databases copied; the new cluster follows every change", len(dbs)))
	return st, nil
}

// switchOver moves the service to green: new connections held (at the
// proxy, or in a Direct blue's listen queue), blue's sessions ended, green
// caught up with blue's last WAL, the sequences copied. It returns at the
// commit point (bgSwitched).
func (b *bgRun) switchOver(ctx context.Context, st *bgState) error {
	ha, err := b.ha()
	if err != nil {
		return err
	}
	blue, green := b.blueSpec(ha, st, true), b.greenSpec(ha, st, false)
	// Before anything is paused: a database green lacks would fail the
	// switch only after its whole catch-up wait, with sessions ended.
	if err := b.refuseNewDatabases(ctx, blue, green); err != nil {
		return err
	}
	if st.Direct {
		if err := b.readyDirect(ctx, blue, green); err != nil {
			return err
		}
	}
	// The pooler connects to blue itself, not through the proxy: it
	// stops, and the ensure after the upgrade starts it on green.
	if err := b.rt.stopPooler(ctx, b.svc.ID); err != nil {
		return err
	}
	b.rt.unwatchPrimary(b.svc.ID)
	b.rt.sessions.close(ctx, b.svc.ID)
	sessions, err := b.openBlue(ctx, blue)
	if err != nil {
		return err
	}
	defer sessions.close(ctx)
	paused := time.Now()
	if err := b.holdNewSessions(ctx, st, blue); err != nil {
		return err
	}
	ended, err := b.endAll(ctx, sessions, blue)
	if err != nil {
		return err
	}
	if err := b.refuseDatabasesMadeMeanwhile(ctx, sessions, green); err != nil {
		return err
	}
	lsn, err := b.caughtUp(ctx, sessions)
	if err != nil {
		return err
	}
	seqs, err := b.copySequences(ctx, sessions, green)
	if err != nil {
		return err
	}
	if _, err := b.copyPasswords(ctx, sessions, green); err != nil {
		return err
	}
	st.Phase = bgSwitched
	if err := b.rt.saveBG(b.svc.ID, st); err != nil {
		return err
	}
	b.done("caught_up", fmt.Sprintf("writes paused; %d sessions ended; the new cluster has every write up to %s; %d sequences copied (%d ms)",
		ended, lsn, seqs, time.Since(paused).Milliseconds()))
	return nil
}

// finishSwitch makes green the service's primary and the proxy's target,
// then stops blue, cleaned of what the upgrade made in it, and keeps it.
// Idempotent from bgSwitched on.
func (b *bgRun) finishSwitch(ctx context.Context, st *bgState) error {
	ha, err := b.ha()
	if err != nil {
		return err
	}
	if ha.Primary != st.Green {
		ha.Ports[st.Green] = st.GreenPort
		if ha.Ports[st.Blue] == 0 {
			// A Direct blue moves to an internal port for its cleaning.
			if ha.Ports[st.Blue], err = b.rt.freeInternalPort(ha); err != nil {
				return err
			}
		}
		ha.Primary, ha.Members, ha.Sync, ha.SyncCount, ha.Logical, ha.Rebuild = st.Green, []int{st.Green}, nil, 0, false, nil
		if err := b.rt.saveHA(b.svc.ID, ha); err != nil {
			return err
		}
	}
	blue, green := b.blueSpec(ha, st, true), b.greenSpec(ha, st, false)
	// Blue stays sealed for its cleaning: a write there now would be
	// lost, or come back at a ROLLBACK.
	blue.Sealed = true
	if st.Phase == bgSwitched {
		if st.Direct {
			// Blue holds the endpoint's address until it exits, and
			// green has every commit of it: it stops at once, without
			// the shutdown checkpoint (and the archiving) that a clean
			// stop would make the pause wait for; its start for the
			// cleaning below recovers from its WAL. Held (SIGSTOP), it
			// takes the SIGQUIT as the stop continues it.
			if err := b.rt.instances.StopImmediately(ctx, blue, 30*time.Second); err != nil {
				return err
			}
		}
		if err := b.rt.setProxy(ctx, b.svc.ID, b.base.Owner, b.rt.proxyListen(b.svc), b.target(green)); err != nil {
			return err
		}
		b.done("switch", "the endpoint serves PostgreSQL "+b.to.Full+"; new connections go to it")
		if err := b.cleanGreen(ctx, green); err != nil {
			return err
		}
		if err := b.rt.instances.Ensure(ctx, blue); err != nil {
			return err
		}
		if err := b.cleanBlue(ctx, blue, st); err != nil {
			return err
		}
		if err := b.rt.stopInstance(ctx, blue, 60*time.Second); err != nil {
			return err
		}
		if err := b.swapArchives(st, st.From, b.greenArchive(st)); err != nil {
			return err
		}
		if err := swapAside(backup.SnapshotsDir(b.rt.serviceDir(b.svc.ID)), st.From, st.To); err != nil {
			return err
		}
		st.Phase = bgKept
		if err := b.rt.saveBG(b.svc.ID, st); err != nil {
			return err
		}
	}
	// Green archives into the service's archive from now on (a reload).
	if err := b.rt.instances.Ensure(ctx, b.greenSpec(ha, st, true)); err != nil {
		return err
	}
	b.done("kept", fmt.Sprintf("the PostgreSQL %s cluster is stopped and kept for %d hours (ROLLBACK)", b.from.Full, int(dbcloud.KeepOldClusterFor.Hours())))
	return nil
}

// swapArchives sets the service's WAL archive aside as the archive of
// version aside, and puts next in its place.
func (b *bgRun) swapArchives(st *bgState, aside int, next string) error {
	archive := b.rt.archiveDir(b.svc.ID)
	if _, err := os.Stat(next); errors.Is(err, fs.ErrNotExist) {
		return nil // done already
	}
	if _, err := os.Stat(archive); err == nil {
		old := archive + "-pg" + strconv.Itoa(aside)
		if err := os.RemoveAll(old); err != nil {
			return err
		}
		if err := os.Rename(archive, old); err != nil {
			return err
		}
	}
	return os.Rename(next, archive)
}

// swapAside moves dir aside as dir-pg<aside>, and dir-pg<back> (set aside
// before) back in its place when it exists. Forks and point-in-time
// restores read dir: its snapshots must be the running version's.
func swapAside(dir string, aside, back int) error {
	if _, err := os.Stat(dir); err == nil {
		to := dir + "-pg" + strconv.Itoa(aside)
		if err := os.RemoveAll(to); err != nil {
			return err
		}
		if err := os.Rename(dir, to); err != nil {
			return err
		}
	}
	from := dir + "-pg" + strconv.Itoa(back)
	if _, err := os.Stat(from); err == nil {
		return os.Rename(from, dir)
	}
	return nil
}

// undo puts the service back on blue, as it was before the attempt:
// blue serving again first, then green removed and blue cleaned of the
// upgrade's objects.
func (b *bgRun) undo(ctx context.Context, st *bgState) error {
	ha, err := b.ha()
	if err != nil {
		return err
	}
	blue, err := b.serveBlue(ctx, ha, st)
	if err != nil {
		return err
	}
	green := b.greenSpec(ha, st, false)
	if err := b.rt.stopInstance(ctx, green, 30*time.Second); err != nil {
		return err
	}
	if err := os.RemoveAll(green.Dir); err != nil {
		return err
	}
	_ = os.RemoveAll(b.greenArchive(st))
	if err := b.cleanBlue(ctx, blue, st); err != nil {
		return err
	}
	if st.Direct {
		// It keeps logical WAL, as its next start would give it.
		return os.Remove(b.rt.bgPath(b.svc.ID))
	}
	// Only now, with the slots gone, may the primary go back to
	// wal_level replica (the ensure that follows restarts it).
	ha.Logical = false
	if err := b.rt.saveHA(b.svc.ID, ha); err != nil {
		return err
	}
	return os.Remove(b.rt.bgPath(b.svc.ID))
}

// serveBlue has blue serve the service's endpoint again, as before the
// attempt: its seal removed, a Direct blue's postmaster continued
// (SIGCONT), its pg_hba.conf opened again when it was sealed (the
// ensure's reload), the proxy pointed back
// at it or, for a Direct blue, stopped. First in an undo, before green's
// teardown (a stop and the removal of a copy of the tenant's data), so
// that the service is down no longer than the switch itself, and stays
// up if the teardown fails. Idempotent.
func (b *bgRun) serveBlue(ctx context.Context, ha *haState, st *bgState) (postgres.Spec, error) {
	blue := b.blueSpec(ha, st, true)
	if err := b.releaseBlue(blue); err != nil {
		return blue, err
	}
	if err := b.rt.instances.Ensure(ctx, blue); err != nil {
		return blue, err
	}
	switch {
	case st.Direct:
		if err := b.rt.stopProxy(ctx, b.svc.ID); err != nil {
			return blue, err
		}
	case b.rt.proxyRunning(b.svc.ID):
		if err := b.rt.setProxy(ctx, b.svc.ID, b.base.Owner, b.rt.proxyListen(b.svc), b.target(blue)); err != nil {
			return blue, err
		}
	}
	return blue, nil
}
