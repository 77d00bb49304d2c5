package cloud

import (
	"context"
	"errors"
	"fmt"
	"time"

	"dbcloud"
)

// DefaultPasswordTimeout bounds an updatePassword's work on the tenant's
// database (Cloud.PasswordTimeout), so that a slow or locked tenant fails
// only its own request.
const DefaultPasswordTimeout = 10 * time.Second

// UpdatePassword sets tsdbadmin's password; it works before this returns,
// and the old one no longer does. The running service is changed first,
// outside any store transaction (a tenant may hold a lock on its role, and
// no other project may wait for that); then the verifier is recorded. A
// lease on the service keeps the engine and other password changes off it
// meanwhile; if dbcloud stops between the two steps, the request was never
// answered and the engine restores the recorded password.
func (c *Cloud) UpdatePassword(ctx context.Context, projectID, id, password string) error {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return err
	}
	if err := dbcloud.ValidatePassword(password); err != nil {
		return err
	}
	verifier := dbcloud.NewSCRAMVerifier(password)
	timeout := c.PasswordTimeout
	if timeout <= 0 {
		timeout = DefaultPasswordTimeout
	}
	// One budget bounds the whole request: the wait for the lease and the
	// work on the tenant's database.
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	owner := "password-" + dbcloud.NewID()
	svc, err := c.passwordLease(actx, projectID, id, owner, timeout)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress,
				"Service %s is being worked on (a repair or a snapshot) and was not free within %v; the password was not changed. Retry in a few seconds.", id, timeout)
		}
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := c.Store.Update(rctx, func(tx dbcloud.Tx) error { return tx.ReleaseLease(svc.ID, owner) }); err != nil {
			c.Logger.Warn("release password lease", "service", svc.ID, "error", err)
		}
	}()
	if err := c.Runtime.SetPassword(actx, svc, verifier); err != nil {
		if dbcloud.ErrorKindOf(err) != dbcloud.KindInternal {
			return err
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// The tenant's database did not answer in time (overloaded by
			// its own sessions): its request fails, nobody waits longer.
			return dbcloud.Errorf(dbcloud.KindConflict, "Service %s did not take the new password within %v (its database is busy); the password was not changed. Retry when it is less loaded.", svc.ID, timeout)
		}
		return fmt.Errorf("set password of %s: %w", svc.ID, err)
	}
	_, err = c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		s.PasswordVerifier = verifier
		return "", nil
	})
	return err
}

// passwordLease takes the service's lease for a password change. A lease
// held by the engine's background work (a snapshot and its restore check,
// a repair, a usage write) is waited for until ctx ends: those finish on
// their own, and a caller who just saw READY must not be refused for
// work it never asked for. A pending operation or a service that is not
// READY is refused at once, since only the caller can change that.
func (c *Cloud) passwordLease(ctx context.Context, projectID, id, owner string, timeout time.Duration) (*dbcloud.Service, error) {
	const poll = 100 * time.Millisecond
	for {
		var svc *dbcloud.Service
		err := c.Store.Update(ctx, func(tx dbcloud.Tx) error {
			s, err := findService(tx, projectID, id)
			if err != nil {
				return err
			}
			if err := busy(tx, s); err != nil {
				return err
			}
			if err := dbcloud.UpdatePassword.Check(s); err != nil {
				return err
			}
			now := c.now()
			ok, err := tx.AcquireLease(s.ID, owner, now, now.Add(timeout+5*time.Second))
			if ok {
				svc = s
			}
			return err
		})
		if err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil || svc != nil {
			return svc, err
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
