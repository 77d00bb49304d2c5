package backup

import (
	"context"
	"io/fs"
	"strings"
	"sync/atomic"
	"syscall"

	"dbcloud/runtime/local/internal/treecopy"
	"dbcloud/runtime/local/postgres"
)

// CopyOptions says how a backup or a snapshot is copied.
type CopyOptions struct {
	// Owner, when set, owns every copied entry (PostgreSQL refuses a data
	// directory it does not own).
	Owner *syscall.Credential
	// Sync fsyncs everything before the copy returns (see copyOptions).
	Sync bool
}

// copyOptions says how copyTree copies (see treecopy.Options).
type copyOptions struct {
	skip  func(rel string, d fs.DirEntry) (skip, skipContents bool)
	owner *syscall.Credential
	sync  bool
}

type copyStats = treecopy.Stats

func copyTree(ctx context.Context, src, dst string, opt copyOptions) (copyStats, error) {
	return treecopy.Tree(ctx, src, dst, treecopy.Options{Skip: opt.skip, Owner: opt.owner, Sync: opt.sync})
}

func copyFile(src, dst string, mode fs.FileMode, owner *syscall.Credential, sync bool, noClone *atomic.Bool) (int64, bool, error) {
	return treecopy.File(src, dst, mode, owner, sync, noClone)
}

func chownTo(path string, owner *syscall.Credential) error { return treecopy.Chown(path, owner) }

// backupSkip leaves out of a copy of a live data directory what
// pg_basebackup leaves out (basebackup.c excludeDirContents and
// excludeFiles): state that is rebuilt at start, WAL (copied separately, up
// to the backup's end), replication slots (the source's, meaningless in a
// copy), the lock file and sockets, and temporary files; and what a
// BLUE_GREEN switch writes for the running server only (its seal).
func backupSkip(rel string, d fs.DirEntry) (skip, skipContents bool) {
	name := d.Name()
	if d.IsDir() {
		switch rel {
		case "pg_wal", "pg_dynshmem", "pg_notify", "pg_replslot", "pg_serial", "pg_snapshots",
			"pg_stat_tmp", "pg_subtrans":
			return false, true
		}
		return strings.HasPrefix(name, "pgsql_tmp"), false
	}
	switch rel {
	case "postmaster.pid", "postmaster.opts", "current_logfiles", "backup_label", "backup_label.old",
		"tablespace_map", "tablespace_map.old", "backup_manifest", "recovery.signal", "standby.signal",
		"postgresql.auto.conf.tmp":
		return true, false
	}
	if postgres.IsSwitchFile(rel) {
		return true, false
	}
	return name == "pg_internal.init" || strings.HasPrefix(name, "pgsql_tmp"), false
}
