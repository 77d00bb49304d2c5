package pgbouncer

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"dbcloud/runtime/local/postgres"
)

// TestRenderPoolerConfig_TLS: clients reach PgBouncer only over TLS 1.2 or
// 1.3 with the instance's AEAD suites, never CBC or SHA-1 ones.
func TestRenderPoolerConfig_TLS(t *testing.T) {
	ini, _ := renderPoolerConfig(Spec{
		ID: "svc-pooler", Dir: "/srv/svc/pooler", ListenAddr: "127.0.0.1", Port: 6432, Host: "127.0.0.1",
		Target: postgres.Spec{ID: "svc-0", Dir: "/srv/svc/0", Port: 5433},
	})
	for _, want := range []string{
		"client_tls_sslmode = require\n",
		"client_tls_protocols = secure\n",
		"client_tls_ciphers = " + postgres.TLSCiphers + "\n",
	} {
		if !strings.Contains(string(ini), want) {
			t.Errorf("pgbouncer.ini lacks %q:\n%s", want, ini)
		}
	}
	for _, suite := range strings.Split(postgres.TLSCiphers, ":") {
		if strings.Contains(suite, "CBC") || strings.HasSuffix(suite, "-SHA") || !strings.Contains(suite, "ECDHE") {
			t.Errorf("suite %s is not ECDHE with AEAD", suite)
		}
	}
}

// TestRenderPoolerConfig_Auth: the lookup runs in dbcloud's database, not
// the client's, and PgBouncer's HBA refuses dbcloud's roles by name, the
// lookup's database, replication and the admin console before any tenant
// line.
func TestRenderPoolerConfig_Auth(t *testing.T) {
	p := Spec{
		ID: "svc-pooler", Dir: "/srv/svc/pooler", ListenAddr: "127.0.0.1", Port: 6432, Host: "127.0.0.1",
		Target: postgres.Spec{ID: "svc-0", Dir: "/srv/svc/0", Port: 5433},
	}
	ini, hba := renderPoolerConfig(p)
	for _, want := range []string{
		"auth_dbname = " + postgres.PoolerDatabase + "\n",
		postgres.PoolerDatabase + " = host=/srv/svc/0/run port=5433 auth_user=" + postgres.PoolerRole + "\n",
		"admin_users = \n",
		"stats_users = \n",
	} {
		if !strings.Contains(string(ini), want) {
			t.Errorf("pgbouncer.ini lacks %q:\n%s", want, ini)
		}
	}
	lines := strings.Split(string(hba), "\n")
	firstTenant := slices.IndexFunc(lines, func(l string) bool { return strings.HasSuffix(l, "scram-sha-256") })
	for _, want := range []string{
		"hostssl  all  postgres,dbcloud_pooler,dbcloud_replicator  0.0.0.0/0  reject",
		"hostssl  all  postgres,dbcloud_pooler,dbcloud_replicator  ::/0  reject",
		"hostssl  pgbouncer,dbcloud  all  0.0.0.0/0  reject",
		"hostssl  replication  all  ::/0  reject",
	} {
		if i := slices.Index(lines, want); i < 0 || i > firstTenant {
			t.Errorf("HBA line %q at %d, want before the first tenant line (%d):\n%s", want, i, firstTenant, hba)
		}
	}
	// A new PgBouncer binary is a restart, not a reload.
	q := p
	q.binary = "/usr/local/lib/dbcloud/pgbouncer-1.25.0-1/bin/pgbouncer"
	newIni, _ := renderPoolerConfig(q)
	if restartSignature(ini) == restartSignature(newIni) {
		t.Error("the restart signature ignores the binary")
	}
}

// TestCheckBinary: a PgBouncer without auth_dbname is refused.
func TestCheckBinary(t *testing.T) {
	for v, want := range map[string]bool{
		"1.18.0": false, "1.19.0": true, "1.24.1": true, "1.25.0rc1": true, "2.0": true, "1.9.0": false, "x": false,
	} {
		if got := atLeast(v, MinMajor, MinMinor); got != want {
			t.Errorf("atLeast(%q) = %v, want %v", v, got, want)
		}
	}
	if v, ok := parseVersion("PgBouncer 1.24.1\nlibevent 2.1.12-stable\n"); !ok || v != "1.24.1" {
		t.Errorf("parseVersion: %q, %v", v, ok)
	}
	// Debian 12's own, when present, is too old.
	const debian = "/usr/sbin/pgbouncer"
	if _, err := os.Stat(debian); err == nil {
		out, _ := exec.Command(debian, "--version").Output()
		if v, _ := parseVersion(string(out)); !atLeast(v, MinMajor, MinMinor) {
			if _, _, err := CheckBinary(debian); err == nil {
				t.Errorf("CheckBinary(%s), version %s: accepted", debian, v)
			} else {
				t.Logf("refused: %v", err)
			}
		}
	}
	if _, _, err := CheckBinary("/nonexistent/pgbouncer"); err == nil {
		t.Error("CheckBinary accepted a missing binary")
	}
}
