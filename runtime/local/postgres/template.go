package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/tenantfs"
	"dbcloud/runtime/local/internal/osuser"
	"dbcloud/runtime/local/internal/treecopy"
	"dbcloud/runtime/local/internal/volume"
)

// A template is one prepared cluster per set of inputs (the binaries,
// initdb's options, the preparation's SQL), made with initdb once, in the
// pool directory as "template-<key>". Pool entries are copies of it
// (clones where the filesystem clones), owned by their entry's OS user as
// they are copied: a copy of about 40 MB costs a fraction of initdb and a
// start and stop of a postmaster, so the pool refills as fast as a burst
// of creates takes from it. It is made like an entry, in a ".tmp-" entry
// renamed into place when complete (a crash leaves only what cleanPool
// removes), and re-made when its key changes (a new PostgreSQL in BinDir);
// the old one is removed then.
//
// Each copy gets a system identifier of its own, as a cluster made by
// initdb has: the identifier ties WAL to the cluster that wrote it
// (recovery refuses WAL of another system, pgBackRest-like tools key
// archives by it), so two services must not share one even though dbcloud
// keeps their WAL apart. The copy's pg_control gets a new random
// identifier, and pg_resetwal, run as the entry's OS user, writes the WAL
// to match (it refuses a cluster not shut down cleanly, which the template
// always is). No secret is in the template: tsdbadmin has no password
// until a claim sets one, and TLS keys are made per service.
const poolTemplatePrefix = "template-"

// templateVersion changes when what a template holds changes in a way its
// inputs do not show.
const templateVersion = "1"

// makeCluster makes work/pgdata (work exists) a stopped, synced cluster
// owned by owner (nil: the Instances' own user), as prepareCluster makes
// it: a copy of the template, made first when build is set (only the
// plane keeping the pool builds it), else by initdb. It says which.
func (m *Instances) makeCluster(ctx context.Context, work string, owner *osuser.Identity, nice int, build bool) (string, error) {
	tpl, err := m.template(ctx, nice, build)
	if err != nil {
		return "", err
	}
	if tpl == "" {
		return "initdb", m.prepareCluster(ctx, work, owner, nice)
	}
	begin := time.Now()
	s, err := m.makeWorkDirs(work, owner)
	if err != nil {
		return "", err
	}
	src, release := tpl, func() {}
	if build {
		// The plane keeping the pool spreads its clones over copies of
		// the template (cloneSource).
		if src, release, err = m.cloneSource(ctx, tpl, nice); err != nil {
			return "", err
		}
	}
	stats, err := treecopy.Tree(ctx, filepath.Join(src, "pgdata"), filepath.Join(work, "pgdata"), treecopy.Options{
		Owner: m.Owner(s), Nice: nice, Skip: skipInCopies,
	})
	release()
	if err != nil {
		return "", err
	}
	copied := time.Now()
	if err := m.newSystemIdentifier(ctx, s, filepath.Join(work, "pgdata"), nice); err != nil {
		return "", err
	}
	reset := time.Now()
	// One syncfs, as prepareCluster ends, instead of a fsync per file.
	if err := syncfs(work); err != nil {
		return "", err
	}
	m.Logger.Info("pool cluster copied from the template", "dir", work, "files", stats.Files, "mb", stats.Bytes>>20,
		"copy_ms", copied.Sub(begin).Milliseconds(), "resetwal_ms", reset.Sub(copied).Milliseconds(),
		"sync_ms", time.Since(reset).Milliseconds())
	if stats.Reflinked {
		return "template clone", nil
	}
	return "template copy", nil
}

// skipInCopies leaves out of a copy of the template postmaster.opts (the
// command line of the template's preparation run, not the copy's) and the
// WAL, which newSystemIdentifier writes anew.
func skipInCopies(rel string, d fs.DirEntry) (bool, bool) {
	return rel == "postmaster.opts" || (strings.HasPrefix(rel, "pg_wal/") && d.Type().IsRegular()), false
}

// template returns the directory of the template for the current inputs,
// making it first when build is set; "" when there is none and build is
// not set.
func (m *Instances) template(ctx context.Context, nice int, build bool) (string, error) {
	if m.PoolDir == "" {
		return "", nil
	}
	key, err := m.templateKey()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(m.PoolDir, poolTemplatePrefix+key)
	if _, err := os.Stat(dir); err == nil || !build {
		if err != nil {
			return "", nil
		}
		return dir, nil
	}
	// One build at a time: the refill's other preparations wait for it
	// rather than each running initdb.
	m.templateMu.Lock()
	defer m.templateMu.Unlock()
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	begin := time.Now()
	work := filepath.Join(m.PoolDir, poolTmpPrefix+poolTemplatePrefix+randomName())
	if err := os.Mkdir(work, 0o755); err != nil {
		return "", err
	}
	// NOCOW on btrfs, and so every copy of it (treecopy keeps the flag).
	if err := volume.NoCOWDir(work); err != nil {
		_ = removeWorkDir(work)
		return "", err
	}
	if err := m.prepareCluster(ctx, work, nil, nice); err != nil {
		_ = removeWorkDir(work)
		return "", fmt.Errorf("make the pool's template cluster: %w", err)
	}
	if err := os.Rename(work, dir); err != nil {
		_ = removeWorkDir(work)
		return "", err
	}
	if err := atomicfile.SyncDir(m.PoolDir); err != nil {
		return "", err
	}
	m.Logger.Info("pool template cluster made", "template", filepath.Base(dir), "ms", time.Since(begin).Milliseconds())
	m.removeStaleTemplates(filepath.Base(dir))
	return dir, nil
}

// removeStaleTemplates removes the templates other than keep (made from
// inputs that changed since).
func (m *Instances) removeStaleTemplates(keep string) {
	entries, _ := os.ReadDir(m.PoolDir)
	for _, e := range entries {
		if name := e.Name(); strings.HasPrefix(name, poolTemplatePrefix) && name != keep {
			m.Logger.Info("removing pool template of other inputs", "template", name)
			if err := removeWorkDir(filepath.Join(m.PoolDir, name)); err != nil {
				m.Logger.Warn("remove pool template", "template", name, "error", err)
			}
		}
	}
}

// templateKey names the template for the current inputs: the binaries
// (path, size and time of initdb and postgres: a new PostgreSQL in place
// changes them), initdb's options, the preparation's SQL, and the OS user
// the template is made as.
func (m *Instances) templateKey() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", templateVersion, m.BinDir, strings.Join(initdbArgs("pgdata"), " "))
	for _, sql := range prepareStatements() {
		fmt.Fprintf(h, "%s\x00", sql)
	}
	for _, bin := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(m.BinDir, bin))
		if err != nil {
			return "", fmt.Errorf("pool template: %w", err)
		}
		fmt.Fprintf(h, "%s %d %d\x00", bin, fi.Size(), fi.ModTime().UnixNano())
	}
	if c := m.cred; c != nil {
		fmt.Fprintf(h, "%d:%d\x00", c.Uid, c.Gid)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// isTemplate says whether a pool directory entry is a template, current or
// stale.
func isTemplate(name string) bool { return strings.HasPrefix(name, poolTemplatePrefix) }

// newSystemIdentifier gives the stopped cluster at pgdata (a copy of the
// template, without WAL) a random system identifier and the WAL to match.
func (m *Instances) newSystemIdentifier(ctx context.Context, s Spec, pgdata string, nice int) error {
	// The entry's files are its OS user's: read and written through
	// tenantfs like every such file.
	path := filepath.Join(pgdata, "global", "pg_control")
	raw, err := tenantfs.ReadFile(path)
	if err != nil {
		return err
	}
	at := controlCRCOffset(raw)
	if at < 0 {
		return fmt.Errorf("%s: no checksum found", path)
	}
	var id [8]byte
	for binary.NativeEndian.Uint64(id[:]) == 0 {
		if _, err := rand.Read(id[:]); err != nil {
			return err
		}
	}
	copy(raw, id[:])
	binary.NativeEndian.PutUint32(raw[at:], crc32.Checksum(raw[:at], crc32.MakeTable(crc32.Castagnoli)))
	f, err := tenantfs.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(raw, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(m.BinDir, "pg_resetwal"), "-D", pgdata)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.Owner(s)}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Start()
	if err == nil {
		lowerPriority(cmd.Process.Pid, nice)
		err = cmd.Wait()
	}
	if err != nil {
		return fmt.Errorf("pg_resetwal %s: %w: %s", pgdata, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// controlCRCOffset finds where pg_control's checksum is: the CRC-32C of
// everything before it, the last field of ControlFileData, whose offset
// differs between PostgreSQL versions; -1 when none matches.
func controlCRCOffset(raw []byte) int {
	for at := 8; at+4 <= len(raw) && at <= 1024; at += 4 {
		if crc32.Checksum(raw[:at], crc32.MakeTable(crc32.Castagnoli)) == binary.NativeEndian.Uint32(raw[at:]) {
			return at
		}
	}
	return -1
}
