package postgres

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud/internal/pgbin"
	"dbcloud/runtime/local/internal/localtest"
)

// waitReady waits until m's pool holds n prepared clusters.
func waitPoolReady(t *testing.T, m *Instances, n int) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); m.PoolReady() < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d ready after 90 s, want %d", m.PoolReady(), n)
		}
	}
}

// templates lists the template directories in m's pool.
func templates(t *testing.T, m *Instances) []string {
	t.Helper()
	entries, err := os.ReadDir(m.PoolDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if isTemplate(e.Name()) {
			names = append(names, e.Name())
		}
	}
	return names
}

// TestPoolTemplate_RemadeWhenInputsChange: pool entries are copies of one
// template, each with a system identifier of its own; a change of the
// template's inputs (here the binaries' directory) makes a new template and
// removes the old one, and a crash's half-made template goes at Open.
func TestPoolTemplate_RemadeWhenInputsChange(t *testing.T) {
	ctx := t.Context()
	base := localtest.Base(t)
	m := mustInstances(t, base, 2)
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, m, 2)
	first := templates(t, m)
	if len(first) != 1 {
		t.Fatalf("templates after the first fill: %v, want one", first)
	}
	ready := m.readyEntries()
	a := systemIdentifier(t, filepath.Join(m.PoolDir, ready[0], "pgdata"))
	b := systemIdentifier(t, filepath.Join(m.PoolDir, ready[1], "pgdata"))
	tpl := systemIdentifier(t, filepath.Join(m.PoolDir, first[0], "pgdata"))
	if a == b || a == tpl || b == tpl {
		t.Errorf("system identifiers: entries %d and %d, template %d; want all different", a, b, tpl)
	}
	m.Close()

	// The same binaries through another directory: other inputs.
	bin := filepath.Join(base, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	names, err := os.ReadDir(pgbin.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range names {
		if err := os.Symlink(filepath.Join(pgbin.Dir(), e.Name()), filepath.Join(bin, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	// A crash mid-way through making a template leaves this.
	if err := os.MkdirAll(filepath.Join(m.PoolDir, poolTmpPrefix+poolTemplatePrefix+"dead", "pgdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	m2, err := NewInstances(Config{BinDir: bin, PoolDir: m.PoolDir, PoolSize: 3, Logger: localtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Close() })
	if err := m2.Open(ctx); err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, m2, 3)
	second := templates(t, m2)
	if len(second) != 1 || second[0] == first[0] {
		t.Errorf("templates after a change of inputs: %v, want one other than %v", second, first)
	}
	if _, err := os.Stat(filepath.Join(m.PoolDir, poolTmpPrefix+poolTemplatePrefix+"dead")); !os.IsNotExist(err) {
		t.Errorf("half-made template survived Open: %v", err)
	}
	// The new entry starts and serves as any other.
	s := mustSpec(t, base, "fromtemplate")
	mustCreate(t, m2, &s)
	if n := queryInt(t, m2, s, "tsdb", "SELECT count(*) FROM pg_roles WHERE rolname = 'tsdbadmin' AND rolcanlogin"); n != 1 {
		t.Errorf("tsdbadmin in a cluster from the template: %d, want 1", n)
	}
}

// TestPoolTemplate_EntriesIsolated: with Identities, a cluster copied from
// the template is its entry's OS user's alone (every file, private modes),
// its server runs as that user, and it accepts its own service's password
// only, not another's made from the same template.
func TestPoolTemplate_EntriesIsolated(t *testing.T) {
	ctx := t.Context()
	base := localtest.Base(t)
	m, users, claimed := openIdentityPool(t, base, "dbcu", 2, 2)
	waitPoolReady(t, m, 2)
	var specs []Spec
	for i, password := range []string{"first-service-pw", "second-service-pw"} {
		id := "iso" + strconv.Itoa(i)
		s := mustSpec(t, base, id)
		key, ok, err := m.Claim(ctx, s.Dir)
		if err != nil || !ok {
			t.Fatalf("claim %d: %v %v", i, ok, err)
		}
		*claimed = append(*claimed, key)
		who, found, err := users.Lookup(key)
		if err != nil || !found {
			t.Fatalf("identity %s: %v %v", key, found, err)
		}
		s.Owner = &who
		err = filepath.WalkDir(s.PGData(), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := os.Lstat(path)
			if err != nil {
				return err
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != who.UID || st.Gid != who.GID {
				t.Errorf("%s owned by %d:%d, want the entry's %d:%d", path, st.Uid, st.Gid, who.UID, who.GID)
			}
			if fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s has mode %v, open to others than its owner", path, fi.Mode().Perm())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		pid := mustCreate(t, m, &s)
		status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			t.Fatal(err)
		}
		if want := "Uid:\t" + strconv.Itoa(int(who.UID)) + "\t"; !strings.Contains(string(status), want) {
			t.Errorf("postmaster %d does not run as the entry's user %d", pid, who.UID)
		}
		if err := setPassword(ctx, m, s, password); err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	if a, b := systemIdentifier(t, specs[0].PGData()), systemIdentifier(t, specs[1].PGData()); a == b {
		t.Errorf("two services share system identifier %d", a)
	}
	for i, s := range specs {
		own, other := []string{"first-service-pw", "second-service-pw"}[i], []string{"first-service-pw", "second-service-pw"}[1-i]
		conn, err := pgx.Connect(ctx, tcpDSN(s, own, "require"))
		if err != nil {
			t.Fatalf("service %d with its own password: %v", i, err)
		}
		conn.Close(ctx)
		if conn, err := pgx.Connect(ctx, tcpDSN(s, other, "require")); err == nil {
			conn.Close(ctx)
			t.Errorf("service %d accepted the other service's password", i)
		}
	}
}
