package postgres

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

	"github.com/jackc/pgx/v5"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/internal/volume"
)

// Standby mechanics: what it takes to make an instance a streaming standby
// of another (a copy, a rewind, the signal file, a slot), to watch it
// follow, and to restart it safely when the hot-standby minimums change.

const (
	// StreamingWait bounds how long a caller waits for standbys to stream
	// or replay.
	StreamingWait = 10 * time.Second
	// slotDropTimeout bounds the wait for a stopped standby's walsender to
	// let go of its slot.
	slotDropTimeout = 10 * time.Second
)

// isRunning reports whether the instance's postmaster runs.
func (m *Instances) isRunning(s Spec) bool {
	_, ok := m.Running(s)
	return ok
}

// CreateSlot makes the physical replication slot name on the primary,
// reserving WAL at once, unless it exists.
func (m *Instances) CreateSlot(ctx context.Context, primary Spec, name string) error {
	// The standby streams as the replication role, which a primary older
	// than it lacks.
	if err := m.Exec(ctx, primary, "postgres", replicatorSQL); err != nil {
		return fmt.Errorf("replication role on %s: %w", primary.ID, err)
	}
	if err := m.Exec(ctx, primary, "postgres",
		`SELECT pg_create_physical_replication_slot($1, true)
		 WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, name); err != nil {
		return fmt.Errorf("slot %s on %s: %w", name, primary.ID, err)
	}
	return nil
}

// RaisesStandbyMinimums reports whether spec asks for a higher value of a
// setting in HotStandbyMinimums than its running postmaster has.
func (m *Instances) RaisesStandbyMinimums(ctx context.Context, spec Spec) (bool, error) {
	raise, _, err := m.standbyMinimumsChange(ctx, spec)
	return raise, err
}

// standbyMinimumsChange compares spec's settings of HotStandbyMinimums with
// those of its running postmaster (none running: no change).
func (m *Instances) standbyMinimumsChange(ctx context.Context, spec Spec) (raise, lower bool, err error) {
	conn, err := m.connectLive(ctx, spec)
	if conn == nil || err != nil {
		return false, false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SELECT name, setting FROM pg_settings WHERE name = ANY($1)", HotStandbyMinimums())
	if err != nil {
		return false, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var name, setting string
		if err := rows.Scan(&name, &setting); err != nil {
			return false, false, err
		}
		now, _ := strconv.Atoi(setting)
		if want, err := strconv.Atoi(spec.Settings[name]); err == nil {
			raise = raise || want > now
			lower = lower || want < now
		}
	}
	return raise, lower, rows.Err()
}

// connectLive connects to spec's running postmaster, which may still
// listen on another port than spec's (a service turning HA moves behind
// the proxy); nil when none runs.
func (m *Instances) connectLive(ctx context.Context, spec Spec) (*pgx.Conn, error) {
	if !m.isRunning(spec) {
		return nil, nil
	}
	live := spec
	if pf, err := ReadPidFile(spec.PGData()); err == nil && pf.Port > 0 {
		live.Port = pf.Port
	}
	return m.Connect(ctx, live, "postgres")
}

// RestartpointPastParameters readies a running standby whose new settings
// lower a hot-standby minimum for its restam. Restarted as it is, it would
// replay again, from its last restartpoint, the primary's parameter-change
// record of the old, higher values and abort ("recovery aborted because of
// insufficient parameter settings"). A checkpoint on the primary (after its
// own restart with the lower values), replayed by the standby, and a
// restartpoint there move the standby's restart past that record.
func (m *Instances) RestartpointPastParameters(ctx context.Context, primary, standby Spec) error {
	if _, lower, err := m.standbyMinimumsChange(ctx, standby); err != nil || !lower || !m.isRunning(primary) {
		return err
	}
	var lsn string
	pc, err := m.Connect(ctx, primary, "postgres")
	if err != nil {
		return err
	}
	if _, err = pc.Exec(ctx, "CHECKPOINT"); err == nil {
		err = pc.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	}
	pc.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("checkpoint on %s: %w", primary.ID, err)
	}
	sc, err := m.connectLive(ctx, standby)
	if err != nil || sc == nil {
		return err
	}
	defer sc.Close(context.WithoutCancel(ctx))
	for deadline := time.Now().Add(StreamingWait); ; {
		var replayed bool
		if err := sc.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", lsn).Scan(&replayed); err != nil {
			return err
		}
		if replayed {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("standby %s did not replay %s's checkpoint at %s within %v", standby.ID, primary.ID, lsn, StreamingWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := sc.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("restartpoint on %s: %w", standby.ID, err)
	}
	return nil
}

// ReceivedLSN is how much WAL the standby conn is connected to (a
// superuser connection, Connect) has safely received. It takes the
// connection rather than a Spec so that a failover can read every
// candidate's at once and promote the winner over the same session.
func ReceivedLSN(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var lsn int64
	err := conn.QueryRow(ctx, `SELECT greatest(
		coalesce(pg_last_wal_receive_lsn() - '0/0', 0),
		coalesce(pg_last_wal_replay_lsn() - '0/0', 0))::bigint`).Scan(&lsn)
	return lsn, err
}

// WriteStandbySignal makes the data directory start as a standby. The
// directory is the service user's: the file is made through tenantfs, so a
// link in its place is refused rather than followed to create a file
// wherever it points.
func (m *Instances) WriteStandbySignal(spec Spec) error {
	return m.appendServerFile(spec, "standby.signal", "")
}

// appendServerFile appends text to the file name of s's data directory,
// making it (owned by s's OS user) when missing, through tenantfs.
func (m *Instances) appendServerFile(s Spec, name, text string) error {
	f, err := tenantfs.OpenFile(filepath.Join(s.PGData(), name), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if c := m.Owner(s); c != nil {
		if err := f.Chown(int(c.Uid), int(c.Gid)); err != nil {
			f.Close()
			return err
		}
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// command runs a PostgreSQL client tool as s's OS user, so what it writes
// belongs to that user; it enters the source by peer identity as the
// replication role.
func (m *Instances) command(ctx context.Context, s Spec, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(m.binDir(s), name), args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", "PGCONNECT_TIMEOUT=10"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.Owner(s)}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Clone makes spec's data directory a fresh base backup of the primary,
// streamed over its unix socket and built beside it, renamed into place
// only when complete. app names the copy in the primary's views.
func (m *Instances) Clone(ctx context.Context, primary, spec Spec, app string) error {
	begin := time.Now()
	if err := m.makeInstanceRoot(spec); err != nil {
		return err
	}
	work := filepath.Join(spec.Dir, ".Clone")
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := m.MakeServerDir(spec, work); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	// A standby's data directory is NOCOW like its primary's (see
	// volume.NoCOWDir): pg_basebackup's files take the flag from work.
	if err := volume.NoCOWDir(work); err != nil {
		return err
	}
	if err := m.command(ctx, spec, "pg_basebackup", "-D", work, "-h", primary.RunDir(), "-p", strconv.Itoa(primary.Port),
		"-U", ReplicatorRole, "-w", "-c", "fast", "-X", "stream", "-d", "application_name="+app); err != nil {
		return fmt.Errorf("copy %s for %s: %w", primary.ID, spec.ID, err)
	}
	// pg_basebackup copies every file it does not know. The seal refuses
	// its login, but one that began before a switch sealed the primary
	// copies the seal and the reason too.
	if err := RemoveSwitchFiles(work); err != nil {
		return err
	}
	if err := os.RemoveAll(spec.PGData()); err != nil {
		return err
	}
	if err := os.Rename(work, spec.PGData()); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(spec.Dir); err != nil {
		return err
	}
	m.Logger.Info("standby copied", "instance", spec.ID, "from", primary.ID, "ms", time.Since(begin).Milliseconds())
	return m.WriteStandbySignal(spec)
}

// RemoveSwitchFiles removes from the data directory pgdata what a
// BLUE_GREEN switch wrote there for the server it was switching from
// (IsSwitchFile): never followed, as pgdata is the tenant's. A missing
// pgdata has none.
func RemoveSwitchFiles(pgdata string) error {
	d, err := tenantfs.OpenDir(pgdata)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.Close()
	for _, name := range switchFiles() {
		if err := d.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Rewind makes a former primary's data directory follow the new primary's
// timeline by copying only what diverged.
func (m *Instances) Rewind(ctx context.Context, primary, spec Spec) error {
	begin := time.Now()
	// pg_rewind first completes the target's crash recovery in single-user
	// mode, which reads the data directory's own postgresql.conf (ours is
	// in Dir/conf): without wal_log_hints there, pg_rewind refuses.
	if err := m.appendServerFile(spec, "postgresql.conf", "\n# dbcloud: pg_rewind's single-user recovery\nwal_log_hints = on\n"); err != nil {
		return err
	}
	if err := m.ownTree(spec, spec.PGData()); err != nil {
		return err
	}
	src := fmt.Sprintf("host=%s port=%d user=%s dbname=postgres", QuoteDSN(primary.RunDir()), primary.Port, ReplicatorRole)
	if err := m.command(ctx, spec, "pg_rewind", "--target-pgdata="+spec.PGData(), "--source-server="+src); err != nil {
		m.Logger.Warn("Rewind failed; copying instead", "instance", spec.ID, "error", err)
		return err
	}
	m.Logger.Info("former primary rewound", "instance", spec.ID, "ms", time.Since(begin).Milliseconds())
	return m.WriteStandbySignal(spec)
}

// WALSenders returns the state (startup, catchup, streaming, ...) of every
// standby connected to the primary, by application name.
func (m *Instances) WALSenders(ctx context.Context, primary Spec) (map[string]string, error) {
	conn, err := m.Connect(ctx, primary, "postgres")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SELECT application_name, state FROM pg_stat_replication")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, state string
		if err := rows.Scan(&name, &state); err != nil {
			return nil, err
		}
		out[name] = state
	}
	return out, rows.Err()
}

// HotStandbyMinimums are the settings a hot standby refuses to run with
// below the primary's values (PostgreSQL 15, "Hot Standby" administrator's
// overview); nodes get the larger of their own size's and the parent's.
func HotStandbyMinimums() []string {
	return []string{"max_connections", "max_worker_processes", "max_wal_senders",
		"max_prepared_transactions", "max_locks_per_transaction"}
}

// DropSlots drops the named replication slots on primary; missing ones are
// fine. A slot is still active for a moment after its standby stopped
// (the walsender exits), so it waits for that, up to a bound.
func (m *Instances) DropSlots(ctx context.Context, primary Spec, names ...string) error {
	deadline := time.Now().Add(slotDropTimeout)
	for {
		conn, err := m.Connect(ctx, primary, "postgres")
		if err != nil {
			return err
		}
		var left int
		err = conn.QueryRow(ctx, `WITH dropped AS (
				SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
				WHERE slot_name = ANY($1) AND NOT active)
			SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1) AND active)::int
			FROM (SELECT count(*) FROM dropped) d`, names).Scan(&left)
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return fmt.Errorf("drop slots %v on %s: %w", names, primary.ID, err)
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drop slots %v on %s: %d still in use after %v", names, primary.ID, left, slotDropTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
