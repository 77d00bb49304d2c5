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
	err := c.underLease(ctx, projectID, id, dbcloud.UpdatePassword, "the password was not changed", func(actx context.Context, svc *dbcloud.Service) error {
		return c.tenantWork(ctx, actx, svc, "the password was not changed", func() error { return c.Runtime.SetPassword(actx, svc, verifier) })
	})
	if err != nil {
		return err
	}
	_, err = c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		s.PasswordVerifier = verifier
		return "", nil
	})
	return err
}

// underLease runs fn on the service while holding its lease, for work on
// the tenant's database that a request waits for (a password, a
// credential): the engine and other such requests stay off the service
// meanwhile. The service must be in a status t allows. One budget
// (PasswordTimeout) bounds the wait for the lease and fn together; when
// the lease is not free in time the caller is told what was not done.
func (c *Cloud) underLease(ctx context.Context, projectID, id string, t dbcloud.Transition, notDone string, fn func(actx context.Context, svc *dbcloud.Service) error) error {
	timeout := c.PasswordTimeout
	if timeout <= 0 {
		timeout = DefaultPasswordTimeout
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	owner := t.Action + "-" + dbcloud.NewID()
	svc, err := c.serviceLease(actx, projectID, id, owner, t, timeout)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress,
				"Service %s is being worked on (a repair or a snapshot) and was not free within %v; %s. Retry in a few seconds.", id, timeout, notDone)
		}
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := c.Store.Update(rctx, func(tx dbcloud.Tx) error { return tx.ReleaseLease(svc.ID, owner) }); err != nil {
			c.Logger.Warn("release service lease", "service", svc.ID, "owner", owner, "error", err)
		}
	}()
	return fn(actx, svc)
}

// tenantWork runs work on the tenant's database and words its failure:
// a domain error as it is, a database that did not answer within the
// budget as a conflict the caller can retry.
func (c *Cloud) tenantWork(ctx, actx context.Context, svc *dbcloud.Service, notDone string, work func() error) error {
	err := work()
	if err == nil || dbcloud.ErrorKindOf(err) != dbcloud.KindInternal {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		// The tenant's database did not answer in time (overloaded by
		// its own sessions): its request fails, nobody waits longer.
		return dbcloud.Errorf(dbcloud.KindConflict, "Service %s did not answer within the time allowed (its database is busy); %s. Retry when it is less loaded.", svc.ID, notDone)
	}
	return fmt.Errorf("service %s: %w", svc.ID, err)
}

// serviceLease takes the service's lease for work a request waits for. A lease
// held by the engine's background work (a snapshot and its restore check,
// a repair, a usage write) is waited for until ctx ends: those finish on
// their own, and a caller who just saw READY must not be refused for
// work it never asked for. A pending operation or a service that is not
// READY is refused at once, since only the caller can change that.
func (c *Cloud) serviceLease(ctx context.Context, projectID, id, owner string, t dbcloud.Transition, timeout time.Duration) (*dbcloud.Service, error) {
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
			if err := t.Check(s); err != nil {
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
