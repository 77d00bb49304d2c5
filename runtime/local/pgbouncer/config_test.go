package pgbouncer

import (
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
