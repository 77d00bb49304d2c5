package postgres

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"dbcloud/runtime/local/internal/osuser"
	"dbcloud/runtime/local/internal/proc"
)

// prepareCluster makes work/pgdata (work exists) a stopped, synced cluster with the
// tsdbadmin role (no password yet) and the tsdb database: initdb without
// fsync (each cluster gets its own system identifier), one start on a
// unix socket only, the SQL, a fast shutdown, and one syncfs instead of
// initdb's per-file fsyncs.
//
// owner is the OS identity the cluster is made as: nil (the Instances'
// own) for the pool, whose clusters are given to their service's identity
// when taken (ownTree), or the service's when made inline.
func (m *Instances) prepareCluster(ctx context.Context, work string, owner *osuser.Identity, nice int) error {
	pgdata := filepath.Join(work, "pgdata")
	s, err := m.makeWorkDirs(work, owner)
	if err != nil {
		return err
	}
	if err := m.MakeServerDir(s, pgdata); err != nil {
		return err
	}

	initdb := exec.CommandContext(ctx, filepath.Join(m.BinDir, "initdb"), initdbArgs(pgdata)...)
	initdb.Dir = work
	initdb.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"}
	// Own process group, killed as a whole on cancel: initdb runs its
	// bootstrap backend through popen, and killing initdb alone would leave
	// that backend writing into a directory being removed.
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: m.Owner(s), Setpgid: true}
	initdb.Cancel = func() error { return syscall.Kill(-initdb.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	initdb.Stdout, initdb.Stderr = &out, &out
	err = initdb.Start()
	if err == nil {
		lowerPriority(initdb.Process.Pid, nice)
		err = initdb.Wait()
	}
	if err != nil {
		if initdb.Process != nil {
			_ = syscall.Kill(-initdb.Process.Pid, syscall.SIGKILL)
		}
		return fmt.Errorf("initdb %s: %w: %s", pgdata, err, strings.TrimSpace(out.String()))
	}

	logPath := filepath.Join(work, "prepare.log")
	c, logStart, err := m.spawnPostmaster(work, logPath, []string{"-D", pgdata,
		"-c", "listen_addresses=",
		"-c", "port=5432",
		"-c", "unix_socket_directories=" + s.RunDir(),
		"-c", "hba_file=" + s.ConfPath(hbaFile),
		"-c", "ident_file=" + s.ConfPath(identFile),
		"-c", "logging_collector=off",
		"-c", "fsync=off", // synced once below
		"-c", "shared_buffers=16MB",
		"-c", "max_connections=10",
		"-c", "cluster_name=dbcloud-pool",
	}, s, nil)
	if err != nil {
		return err
	}
	lowerPriority(c.PID, nice)
	// Stopped whatever happens below, even when ctx is cancelled.
	stopErr := func() error {
		_ = syscall.Kill(c.PID, syscall.SIGINT)
		if m.sup.Wait(context.Background(), c.PID, prepareStopTimeout) {
			return c.Err()
		}
		_ = syscall.Kill(c.PID, syscall.SIGKILL)
		<-c.Exited()
		return fmt.Errorf("preparation postmaster %d did not stop within %v", c.PID, prepareStopTimeout)
	}
	if err := m.waitReady(ctx, s, c.PID, c); err != nil {
		_ = stopErr()
		return fmt.Errorf("%w%s", err, proc.LogTail(logPath, logStart))
	}
	for _, sql := range prepareStatements() {
		if err := m.Exec(ctx, s, "postgres", sql); err != nil {
			_ = stopErr()
			return err
		}
	}
	if err := stopErr(); err != nil {
		return fmt.Errorf("stop preparation postmaster: %w%s", err, proc.LogTail(logPath, logStart))
	}
	return syncfs(work)
}

// initdbArgs are initdb's arguments for a cluster in pgdata: no fsync
// (synced once when complete), peer authentication on the socket, -k
// (data checksums): PostgreSQL checks every page it reads. On btrfs the
// data directory is NOCOW (volume.NoCOWDir), which turns btrfs's own data
// checksums off; these take their place. And WAL segments of
// WALSegmentMB.
func initdbArgs(pgdata string) []string {
	return []string{"-D", pgdata, "-N", "-k", "-U", "postgres", "-A", "peer", "--auth-host=scram-sha-256",
		"-E", "UTF8", "--locale=C", "--wal-segsize=" + strconv.Itoa(WALSegmentMB)}
}

// WALSegmentMB is the WAL segment size of the clusters dbcloud makes, in
// MiB, instead of PostgreSQL's default 16. A segment is written whole
// (initialised with zeros, and its rest when a switch ends it early: a
// snapshot's, or archive_timeout's on a quiet service), and the archive
// keeps every one: with 16 MiB segments a new service that had made one
// snapshot and been paused held 80 MiB of WAL (48 in pg_wal, 32 archived)
// beside 0.4 MiB of data of its own, so 2,000 of them would not fit on a
// 66 GB disk. Services keep the size they were made with (a fork, a
// standby and an upgrade take their source's).
const WALSegmentMB = 1

// prepareStatements is the SQL a preparation runs on a fresh cluster.
func prepareStatements() []string {
	return []string{
		"CREATE ROLE tsdbadmin LOGIN CREATEDB CREATEROLE",
		"CREATE DATABASE tsdb OWNER tsdbadmin",
		replicatorSQL,
	}
}

// makeWorkDirs makes what a preparation run of a cluster in work needs
// beside work/pgdata (its socket directory, and its pg_hba.conf and
// pg_ident.conf mapping owner, the OS user it is made as), and returns the
// throwaway spec of that run, which gives it the same peer mapping as the
// instance will have.
func (m *Instances) makeWorkDirs(work string, owner *osuser.Identity) (Spec, error) {
	s := Spec{ID: "pool", Dir: work, Port: 5432, Owner: owner}
	if err := m.MakeServerDir(s, s.RunDir()); err != nil {
		return s, err
	}
	if err := m.makeReadOnlyDir(s, s.ConfDir()); err != nil {
		return s, err
	}
	_, hba, ident := RenderConfig(s, m.osUser)
	for name, data := range map[string]string{hbaFile: hba, identFile: ident} {
		if err := m.writeReadOnlyFile(s, s.ConfPath(name), []byte(data), 0o600); err != nil {
			return s, err
		}
	}
	return s, nil
}

// lowerPriority sets the nice value of the process group led by pid (a
// preparation's initdb or postmaster, and what they fork) when nice is
// above 0. Best effort: a preparation at normal priority is only slower
// for the creates around it.
func lowerPriority(pid, nice int) {
	if nice > 0 {
		_ = syscall.Setpriority(syscall.PRIO_PGRP, pid, nice)
	}
}

// removeWorkDir removes a preparation directory, first killing any server
// still running in it: a crash of dbcloud while a preparation postmaster (or
// initdb's bootstrap backend) ran leaves that process alive, in its own
// session, writing into the directory.
func removeWorkDir(dir string) error {
	if err := stopWork(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// stopWork kills what a preparation in dir has running (workProcesses).
func stopWork(dir string) error {
	find := func() ([]int, error) { return workProcesses(dir), nil }
	if err := proc.KillAll(context.Background(), find, time.Now().Add(10*time.Second)); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// workProcesses finds what a preparation in dir has running: initdb (its
// working directory is dir) and the servers it or a start runs on
// dir/pgdata. initdb has a process group of its own, so one that a crash
// of dbcloud cut short goes on writing into pgdata until it is killed.
func workProcesses(dir string) []int {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil
	}
	pgdata := filepath.Join(real, "pgdata")
	return proc.Find(func(pid int) bool {
		base := filepath.Base(proc.Exe(pid))
		if !strings.HasPrefix(base, "postgres") && !strings.HasPrefix(base, "initdb") {
			return false
		}
		cwd := proc.Cwd(pid)
		return cwd == real || cwd == pgdata
	})
}

// syncfs flushes the whole filesystem holding dir: one call instead of an
// fsync per file of a fresh cluster (about a thousand).
func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}
