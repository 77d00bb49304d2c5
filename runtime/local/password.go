package local

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"dbcloud"
	"dbcloud/runtime/local/postgres"
)

// PasswordBudget is how long an updatePassword may take here
// (dbcloud.PasswordBudgeter): the ALTER ROLE on the host's primary
// answers in milliseconds, so the budget only bounds a tenant that holds
// a lock on its own role, whose request then fails alone.
func (rt *Runtime) PasswordBudget() time.Duration { return 10 * time.Second }

// SetPassword makes the verifier tsdbadmin's password on the running primary.
func (rt *Runtime) SetPassword(ctx context.Context, svc *dbcloud.Service, verifier string) error {
	spec, err := rt.primary(svc)
	if err != nil {
		return err
	}
	err = rt.setVerifier(ctx, spec, verifier)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		// lock_not_available, after lock_timeout: a session of the
		// tenant's holds a lock on the role.
		return dbcloud.Errorf(dbcloud.KindConflict,
			"A session of service %s holds a lock on role tsdbadmin (an open transaction that changed it), so the password was not changed; commit or roll back that transaction and retry.", svc.ID)
	}
	return err
}

// setVerifier sends the SCRAM verifier, never a plaintext password, so the
// password reaches neither PostgreSQL's logs nor any process list.
func (rt *Runtime) setVerifier(ctx context.Context, spec postgres.Spec, verifier string) error {
	if err := checkVerifier(spec, verifier); err != nil {
		return err
	}
	if err := rt.instances.Exec(ctx, spec, "postgres", alterPassword(verifier)); err != nil {
		return fmt.Errorf("set password on %s: %w", spec.ID, err)
	}
	return nil
}

// setVerifierOn is setVerifier on a superuser session the caller has.
func setVerifierOn(ctx context.Context, conn *pgx.Conn, spec postgres.Spec, verifier string) error {
	if err := checkVerifier(spec, verifier); err != nil {
		return err
	}
	// Every ensure (every start and wake) checks the password; writing
	// it when it is already the role's is a catalog update and a WAL
	// flush beside the sessions a wake just let through.
	var same bool
	if err := conn.QueryRow(ctx, "SELECT coalesce(rolpassword = $1, false) FROM pg_authid WHERE rolname = 'tsdbadmin'", verifier).Scan(&same); err == nil && same {
		return nil
	}
	if _, err := conn.Exec(ctx, alterPassword(verifier)); err != nil {
		return fmt.Errorf("set password on %s: %w", spec.ID, err)
	}
	return nil
}

func checkVerifier(spec postgres.Spec, verifier string) error {
	if !strings.HasPrefix(verifier, "SCRAM-SHA-256$") {
		return dbcloud.Terminal(fmt.Errorf("instance %s: stored password is not a SCRAM verifier", spec.ID))
	}
	return nil
}

func alterPassword(verifier string) string {
	return "ALTER ROLE tsdbadmin PASSWORD " + postgres.QuoteLiteral(verifier)
}
