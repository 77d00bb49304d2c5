package local

import (
	"context"
	"testing"

	"dbcloud"
	"dbcloud/runtime/local/postgres"
)

// TestEnsure_RevokesReservedMemberships: a membership the guard refuses
// now but a tenant could grant before (GRANT pg_write_all_data TO
// tsdbadmin; pg_read_all_data to a role of its own) is gone after the
// service's next ensure, while a predefined role the guard allows
// (pg_monitor) stays.
func TestEnsure_RevokesReservedMemberships(t *testing.T) {
	ctx := context.Background()
	f := mustPooler(t, dbcloud.SharedSize)
	// The fixture's pooler port is its own, not the service's: ensured
	// without a pooler.
	f.svc.Spec.Pooler = false
	// As a tenant could before the guard refused them: granted by the
	// superuser here, since the guard now refuses the tenant.
	for _, sql := range []string{
		"CREATE ROLE reader LOGIN",
		"GRANT pg_write_all_data, pg_read_all_data TO tsdbadmin",
		"GRANT pg_read_all_data TO reader",
		"GRANT pg_monitor TO reader",
	} {
		if err := f.rt.instances.Exec(ctx, f.spec, "postgres", sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if _, err := f.rt.EnsureService(ctx, f.svc); err != nil {
		t.Fatal(err)
	}
	var refused, kept int
	if err := superQueryRow(ctx, f.rt.instances, f.spec, "postgres", `SELECT
		count(*) FILTER (WHERE r.rolname IN ('pg_write_all_data', 'pg_read_all_data')),
		count(*) FILTER (WHERE r.rolname = 'pg_monitor' AND m.rolname = 'reader')
		FROM pg_auth_members a JOIN pg_roles r ON r.oid = a.roleid JOIN pg_roles m ON m.oid = a.member`,
		&refused, &kept); err != nil {
		t.Fatal(err)
	}
	if refused != 0 {
		t.Errorf("%d memberships in pg_read_all_data or pg_write_all_data after the ensure, want 0", refused)
	}
	if kept != 1 {
		t.Errorf("reader's pg_monitor membership: %d, want it kept", kept)
	}
	// Nothing to revoke: the ensure again writes nothing and succeeds.
	if _, err := f.rt.EnsureService(ctx, f.svc); err != nil {
		t.Fatal(err)
	}
}

// TestEnsure_PasswordWrittenWhenDifferent: an ensure of a service whose
// role already has its password (every start and every wake) does not
// write it again (the role's row keeps its version), while one the
// tenant changed is set back.
func TestEnsure_PasswordWrittenWhenDifferent(t *testing.T) {
	ctx := context.Background()
	f := mustPooler(t, dbcloud.SharedSize)
	f.svc.Spec.Pooler = false
	if _, err := f.rt.EnsureService(ctx, f.svc); err != nil {
		t.Fatal(err)
	}
	row := func() (version string, same bool) {
		t.Helper()
		if err := superQueryRow(ctx, f.rt.instances, f.spec, "postgres",
			"SELECT xmin::text, rolpassword = "+postgres.QuoteLiteral(f.svc.PasswordVerifier)+" FROM pg_authid WHERE rolname = 'tsdbadmin'", &version, &same); err != nil {
			t.Fatal(err)
		}
		return version, same
	}
	before, _ := row()
	if _, err := f.rt.EnsureService(ctx, f.svc); err != nil {
		t.Fatal(err)
	}
	if after, same := row(); after != before || !same {
		t.Errorf("tsdbadmin's row went from version %s to %s (password as stored: %v): the unchanged password was written again", before, after, same)
	}
	if err := f.rt.instances.Exec(ctx, f.spec, "postgres", "ALTER ROLE tsdbadmin PASSWORD 'changed-by-the-tenant'"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rt.EnsureService(ctx, f.svc); err != nil {
		t.Fatal(err)
	}
	if _, same := row(); !same {
		t.Error("a password the tenant changed was not set back by the ensure")
	}
}
