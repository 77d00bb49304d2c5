package local

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"dbcloud"
	"dbcloud/internal/atomicfile"
	"dbcloud/internal/flock"
	"dbcloud/pglog"
)

// cursorKeyFile holds the key that signs log cursors, in the runtime's data
// directory: kept on disk so that cursors stay good across restarts of
// dbcloud, private because whoever has it can forge them.
const cursorKeyFile = "cursor.key"

// LogRetention bounds each instance's PostgreSQL logs (issue 4): the logs
// keep at least MaxAge of history or at least MaxBytes, whichever is less
// (see pglog.Prune). A zero field takes its default.
type LogRetention struct {
	MaxAge   time.Duration
	MaxBytes int64
	// Every is how often the bound is applied. A log that grows fast
	// (10 MB/s at 20k tps) overshoots MaxBytes by about Every times its rate.
	Every time.Duration
}

// DefaultLogRetention keeps at least 7 days or 1 GiB of each instance's logs,
// checked every 30 seconds.
func DefaultLogRetention() LogRetention {
	return LogRetention{MaxAge: 7 * 24 * time.Hour, MaxBytes: 1 << 30, Every: 30 * time.Second}
}

func (r LogRetention) withDefaults() LogRetention {
	d := DefaultLogRetention()
	if r.MaxAge <= 0 {
		r.MaxAge = d.MaxAge
	}
	if r.MaxBytes <= 0 {
		r.MaxBytes = d.MaxBytes
	}
	if r.Every <= 0 {
		r.Every = d.Every
	}
	return r
}

// readLogs serves Runtime.Logs from the jsonlog files of the service's
// instances. It reads files only, so logs stay readable while the service
// is paused and after dbcloud restarts; they go when DeleteService removes
// the service directory.
func (rt *Runtime) readLogs(ctx context.Context, svc *dbcloud.Service, q dbcloud.LogQuery) (*dbcloud.LogPage, error) {
	key, err := rt.logCursorKey()
	if err != nil {
		return nil, fmt.Errorf("logs of %s: %w", svc.ID, err)
	}
	sources, err := rt.logSources(svc.ID, q.Node)
	if err != nil {
		return nil, fmt.Errorf("logs of %s: %w", svc.ID, err)
	}
	// The node filter is part of the scope: a cursor's positions are per
	// node, so one made for node 1 cannot continue a read of all nodes.
	scope := svc.ID + "/all"
	if q.Node != nil {
		scope = svc.ID + "/" + strconv.Itoa(*q.Node)
	}
	page, err := (&pglog.Reader{Key: key, Redact: rt.logRedactor(svc.ID)}).Read(ctx, sources, pglog.Query{
		Cursor: q.Cursor, Scope: scope, Since: q.Since, Until: q.Until,
		Severities: q.Severities, Search: q.Search, Limit: q.Limit,
	})
	if err != nil {
		return nil, fmt.Errorf("logs of %s: %w", svc.ID, err)
	}
	out := &dbcloud.LogPage{Entries: make([]dbcloud.LogEntry, len(page.Entries)), Cursor: page.Cursor}
	for i, e := range page.Entries {
		out.Entries[i] = dbcloud.LogEntry{Timestamp: e.Timestamp, Severity: e.Severity, Message: e.Message}
	}
	return out, nil
}

// logRedactor rewrites the host paths a message of the service's logs
// may name (its directory, the runtime directory, the PostgreSQL
// installation) into neutral names: a tenant reads these lines, and the
// host's layout is none of its business (issue 30).
func (rt *Runtime) logRedactor(serviceID string) *pglog.Redactor {
	paths := []pglog.PathName{{Path: rt.serviceDir(serviceID), Name: "<service>"}}
	for _, p := range rt.hostLogPaths() {
		if p.Name == "<runtime>" {
			// The same service directory, through the runtime
			// directory's other spelling.
			paths = append(paths, pglog.PathName{Path: filepath.Join(p.Path, "services", serviceID), Name: "<service>"})
		}
		paths = append(paths, p)
	}
	return pglog.NewRedactor(paths)
}

// hostLogPaths returns the runtime-wide paths logRedactor rewrites, found
// once (the share directory costs a pg_config run): each as configured
// and as resolved through symbolic links, then the usual places of a
// Debian install and of the runtime, should a message name a path of
// another version or of another runtime directory.
func (rt *Runtime) hostLogPaths() []pglog.PathName {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.logPaths != nil {
		return rt.logPaths
	}
	both := func(path, name string) []pglog.PathName {
		if path == "" {
			return nil
		}
		out := []pglog.PathName{{Path: path, Name: name}}
		if real, err := filepath.EvalSymlinks(path); err == nil && real != path {
			out = append(out, pglog.PathName{Path: real, Name: name})
		}
		return out
	}
	paths := both(rt.cfg.DataDir, "<runtime>")
	if rt.cfg.BinDir != "" {
		paths = append(paths, both(filepath.Dir(rt.cfg.BinDir), "<postgresql>")...)
		if share, err := pgShareDir(rt.cfg.BinDir); err == nil {
			paths = append(paths, both(share, "<postgresql-share>")...)
		}
	}
	paths = append(paths,
		pglog.PathName{Path: "/usr/lib/postgresql", Name: "<postgresql>"},
		pglog.PathName{Path: "/usr/share/postgresql", Name: "<postgresql-share>"},
		pglog.PathName{Path: "/var/lib/dbcloud", Name: "<runtime>"})
	rt.logPaths = paths
	return paths
}

// pgShareDir returns the share directory of the PostgreSQL in binDir.
func pgShareDir(binDir string) (string, error) {
	out, err := exec.Command(filepath.Join(binDir, "pg_config"), "--sharedir").Output()
	if err != nil {
		return "", fmt.Errorf("pg_config --sharedir: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// logSources returns the log directories of the service's instances: all
// of them (serviceDir/<n>/log) or only that of node.
func (rt *Runtime) logSources(serviceID string, node *int) ([]pglog.Source, error) {
	dir := rt.serviceDir(serviceID)
	if node != nil {
		return []pglog.Source{{Node: *node, Dir: filepath.Join(dir, strconv.Itoa(*node), "log")}}, nil
	}
	nodes, err := instanceNodes(dir)
	if err != nil {
		return nil, err
	}
	out := make([]pglog.Source, len(nodes))
	for i, n := range nodes {
		out[i] = pglog.Source{Node: n, Dir: filepath.Join(dir, strconv.Itoa(n), "log")}
	}
	return out, nil
}

// instanceNodes lists the instance directories of a service directory by
// node number, in order; none when the directory does not exist.
func instanceNodes(serviceDir string) ([]int, error) {
	entries, err := os.ReadDir(serviceDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var nodes []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n < 0 || !e.IsDir() || strconv.Itoa(n) != e.Name() {
			continue
		}
		nodes = append(nodes, n)
	}
	sort.Ints(nodes)
	return nodes, nil
}

// logCursorKey returns the key that signs this runtime's log cursors,
// read (or made) once: a key file never changes once made, and logs
// requests should not read it every time.
func (rt *Runtime) logCursorKey() ([]byte, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.cursorKey == nil {
		key, err := loadCursorKey(filepath.Join(rt.cfg.DataDir, cursorKeyFile))
		if err != nil {
			return nil, err
		}
		rt.cursorKey = key
	}
	return rt.cursorKey, nil
}

// loadCursorKey returns the key in path, making it (32 random bytes, mode
// 0600) the first time. The file is written under a temporary name and
// linked into place, so a crash leaves no short key and two makers agree
// on the one that was linked first.
func loadCursorKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key, err = makeCursorKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("cursor key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("cursor key %s has %d bytes, want 32; remove it to make a new one (open cursors become invalid)", path, len(key))
	}
	return key, nil
}

func makeCursorKey(path string) ([]byte, error) {
	key := make([]byte, 32)
	rand.Read(key)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".cursor-key-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(key); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	// CreateTemp makes the file 0600. Link fails if another maker was
	// first: theirs is the key.
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		return os.ReadFile(path)
	} else if err != nil {
		return nil, err
	}
	return key, atomicfile.SyncDir(filepath.Dir(path))
}

// PruneLogs applies the retention bound to the logs of every instance of
// every service and returns how many files it removed. A service being
// deleted meanwhile is no error.
func (rt *Runtime) PruneLogs(ctx context.Context, ret LogRetention) (removed int, err error) {
	ret = ret.withDefaults()
	services, err := os.ReadDir(filepath.Join(rt.cfg.DataDir, "services"))
	if err != nil {
		return 0, fmt.Errorf("prune logs: %w", err)
	}
	now := time.Now()
	var errs []error
	for _, s := range services {
		if !s.IsDir() {
			continue
		}
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		dir := filepath.Join(rt.cfg.DataDir, "services", s.Name())
		nodes, err := instanceNodes(dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("prune logs of %s: %w", s.Name(), err))
			continue
		}
		for _, n := range nodes {
			k, err := pglog.Prune(filepath.Join(dir, strconv.Itoa(n), "log"), ret.MaxAge, ret.MaxBytes, now)
			removed += k
			if err != nil {
				errs = append(errs, fmt.Errorf("prune logs of %s-%d: %w", s.Name(), n, err))
			}
		}
	}
	return removed, errors.Join(errs...)
}

// logRetentionLock, in the runtime directory, is held during a round of
// log retention.
const logRetentionLock = ".log-retention.lock"

// RunLogRetention applies the retention bound every ret.Every until ctx
// ends. Failures are logged, once per round, and retried next round: the
// bound protects the disk, so it never gives up.
func (rt *Runtime) RunLogRetention(ctx context.Context, ret LogRetention) {
	ret = ret.withDefaults()
	t := time.NewTicker(ret.Every)
	defer t.Stop()
	for {
		rt.logRetentionRound(ctx, ret)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// logRetentionRound is one round of RunLogRetention. Control planes
// sharing the runtime directory take turns: a round runs in whichever
// takes the lock, the others skip it. The lock is released however the
// round ends, a panic included, or the restarted loop would never take it.
func (rt *Runtime) logRetentionRound(ctx context.Context, ret LogRetention) {
	lock, ok, err := flock.TryLock(filepath.Join(rt.cfg.DataDir, logRetentionLock))
	if err != nil {
		rt.cfg.Logger.Warn("log retention", "error", err)
	}
	if !ok {
		return
	}
	defer lock.Unlock()
	n, err := rt.PruneLogs(ctx, ret)
	if err != nil && ctx.Err() == nil {
		rt.cfg.Logger.Warn("log retention", "error", err)
	}
	if n > 0 {
		rt.cfg.Logger.Info("log retention removed old log files", "files", n)
	}
}
