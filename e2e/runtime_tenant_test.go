package e2e

import (
	"context"
	"testing"

	"dbcloud/internal/pgtest"
)

// TestRuntime_TenantConfined runs the tenant escape checks through the API
// and the endpoints only, so on Kubernetes they run inside the service's
// pod: tsdbadmin of one service, over TLS, tries the ways out of its
// database that TestGuard_Tenant tries on the host, and those a pod adds
// (the service account token CNPG mounts, the certificates beside the
// data), then another service of the same project. Every attempt is
// refused, and the other service's data is as it left it.
func TestRuntime_TenantConfined(t *testing.T) {
	parallelOnLocal(t)
	s := newServer(t)
	ctx := context.Background()
	createdA := s.create(map[string]any{"name": "tenant-a", "cpu_millis": "shared"})
	createdB := s.create(map[string]any{"name": "tenant-b", "cpu_millis": "shared"})
	a := s.waitStatus(createdA.ServiceID, "READY", readyWithin())
	b := s.waitStatus(createdB.ServiceID, "READY", readyWithin())
	cb := s.mustConnect(b, createdB.InitialPassword)
	if _, err := cb.Exec(ctx, "CREATE TABLE secret(v text); INSERT INTO secret VALUES ('b')"); err != nil {
		t.Fatal(err)
	}
	ca := s.mustConnect(a, createdA.InitialPassword)
	if _, err := ca.Exec(ctx, "CREATE TABLE out(line text)"); err != nil {
		t.Fatal(err)
	}

	if got := queryValues(t, ca, `SELECT rolsuper::text FROM pg_roles WHERE rolname = current_user`); len(got) != 1 || got[0] != "false" {
		t.Fatalf("tsdbadmin's rolsuper: %q, want false", got)
	}
	refused := append(append([]string(nil), tenantEscapes...),
		// Files a pod adds: the token of the instance's service account,
		// which may read its cluster's secrets, and the server's key.
		"SELECT pg_read_file('/var/run/secrets/kubernetes.io/serviceaccount/token')",
		"SELECT pg_ls_dir('/var/run/secrets/kubernetes.io/serviceaccount')",
		"SELECT pg_ls_dir('/controller/certificates')",
		"SELECT lo_import('/etc/passwd')",
	)
	for _, sql := range refused {
		if _, err := ca.Exec(ctx, sql); pgtest.SQLState(err) != "42501" {
			t.Errorf("%s: got %v, want SQLSTATE 42501", sql, err)
		}
	}
	// Extensions that open connections out of the database (to another
	// service's server, say) are not the tenant's to create. Whether the
	// image ships them decides the error, not whether there is one.
	for _, ext := range []string{"dblink", "postgres_fdw", "file_fdw"} {
		if _, err := ca.Exec(ctx, "CREATE EXTENSION "+ext); err == nil {
			t.Errorf("CREATE EXTENSION %s as tsdbadmin succeeded", ext)
		}
	}
	if got := queryValues(t, ca, `SELECT count(*)::text FROM out`); len(got) != 1 || got[0] != "0" {
		t.Errorf("out has %q lines: a program or file was read", got)
	}

	// The other service: A's password does not open it.
	if c, err := s.connect(ctx, b, createdA.InitialPassword); err == nil {
		c.Close(ctx)
		t.Error("service B's endpoint accepted tsdbadmin with service A's password")
	} else if code := pgtest.SQLState(err); code != "28P01" {
		t.Errorf("service B's endpoint with A's password: %v, want SQLSTATE 28P01", err)
	}
	if got := queryValues(t, cb, `SELECT string_agg(v, ',') FROM secret`); len(got) != 1 || got[0] != "b" {
		t.Errorf("service B's data after A's attempts: %q, want [b]", got)
	}
}
