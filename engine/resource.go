package engine

import (
	"context"
	"fmt"
	"time"

	"dbcloud"
)

// kind is what the engine's flow needs to know of one kind of provisioned
// resource (a service, a read replica set): how to name it in logs, read
// and write its row, and show a result on it. The flow itself (settle,
// record a failed attempt, delete, re-read and update) is written once
// below, so the kinds differ only in what their declarations say.
type kind[R any] struct {
	name string // in log messages: "read replica set"
	attr string // the log attribute that names one: "replica_set"

	ref       func(r *R) (projectID, id string, gen int64)
	status    func(r *R) (status, reason string)
	setStatus func(r *R, status, reason string)
	// The statuses the flow acts on: running as asked; not running, with
	// the reason (also once the engine stops retrying); being deleted.
	ready, broken, deleting string

	find   func(tx dbcloud.Tx, projectID, id string) (*R, error)
	save   func(tx dbcloud.Tx, r *R) error
	remove func(tx dbcloud.Tx, projectID, id string) error
}

// at reports whether r is still at generation gen with status st: a
// change made since (another plane's, a request's) leaves it alone.
func (k *kind[R]) at(r *R, gen int64, st string) bool {
	_, _, g := k.ref(r)
	s, _ := k.status(r)
	return g == gen && s == st
}

// settle asks ensure to make r real and shows what it observed with show
// (what runs, and the settled status if gen is still the newest), with the
// operations that asked for it ended in the same transaction (step 2: what
// was asked is real; show it, unless more was asked since). A failure is
// recorded as a failed attempt.
func settle[R any](ctx context.Context, e *Engine, k *kind[R], r *R,
	ensure func() (*dbcloud.Observation, error), show func(r *R, obs *dbcloud.Observation, gen int64)) error {
	_, id, gen := k.ref(r)
	start := time.Now()
	obs, err := ensure()
	if err != nil {
		return failed(ctx, e, k, r, err)
	}
	e.clearBackoff(id)
	err = update(ctx, e, k, r, func(r *R) bool {
		show(r, obs, gen)
		return true
	}, func(tx dbcloud.Tx) error {
		return finishOperationsTx(tx, id, gen, dbcloud.OpSucceeded, "", e.now())
	})
	if err != nil {
		return err
	}
	e.Logger.Info(k.name+" reconciled", k.attr, id, "generation", gen, "running", obs.Running,
		"duration_ms", time.Since(start).Milliseconds())
	return nil
}

// failed records a failed attempt: a retryable error backs off and tries
// again; a terminal one, or too many attempts, fails the operations and
// shows the resource broken with the reason.
func failed[R any](ctx context.Context, e *Engine, k *kind[R], r *R, cause error) error {
	if ctx.Err() != nil {
		return ctx.Err() // lost the lease or shutting down: not the resource's fault
	}
	_, id, gen := k.ref(r)
	giveUp, err := e.attemptFailed(ctx, id, cause)
	if err != nil || !giveUp {
		return err
	}
	reason := reasonOf(cause)
	return update(ctx, e, k, r, func(r *R) bool {
		if st, _ := k.status(r); st == k.deleting {
			return false
		}
		k.setStatus(r, k.broken, reason)
		return true
	}, func(tx dbcloud.Tx) error {
		return finishOperationsTx(tx, id, gen, dbcloud.OpFailed, reason, e.now())
	})
}

// remove runs deprovision (processes, files, addresses), then deletes the
// row, frees its ports and ends its operations. A failed deprovision backs
// off and is tried again.
func remove[R any](ctx context.Context, e *Engine, k *kind[R], r *R, deprovision func() error) error {
	projectID, id, _ := k.ref(r)
	if err := deprovision(); err != nil {
		if ctx.Err() == nil {
			attempts, cerr := e.countAttempt(ctx, id, err)
			if cerr != nil {
				return cerr
			}
			e.backoff(id, attempts)
		}
		return fmt.Errorf("delete %s %s: %w", k.name, id, err)
	}
	e.clearBackoff(id)
	err := e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if err := k.remove(tx, projectID, id); err != nil && !dbcloud.IsNotFound(err) {
			return err
		}
		if err := tx.ReleasePorts(id); err != nil {
			return err
		}
		return finishOperationsTx(tx, id, 0, dbcloud.OpSucceeded, "", e.now())
	})
	if err == nil {
		e.Logger.Info(k.name+" deleted", k.attr, id)
	}
	return err
}

// update re-reads the resource inside a write transaction and applies fn to
// the fresh copy, so the engine never overwrites a concurrent request's
// change with a stale one. fn returns false to leave it unchanged. then, if
// not nil, runs first in the same transaction: a status and the end of the
// operations that led to it are seen together, so a client that sees READY
// can act at once. r becomes the copy written.
func update[R any](ctx context.Context, e *Engine, k *kind[R], r *R, fn func(r *R) bool, then func(tx dbcloud.Tx) error) error {
	projectID, id, _ := k.ref(r)
	return e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if then != nil {
			if err := then(tx); err != nil {
				return err
			}
		}
		fresh, err := k.find(tx, projectID, id)
		if dbcloud.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		before, _ := k.status(fresh)
		if !fn(fresh) {
			return nil
		}
		if after, reason := k.status(fresh); after != before {
			e.Logger.Info(k.name+" status", k.attr, id, "from", before, "to", after, "reason", reason)
		}
		*r = *fresh
		return k.save(tx, fresh)
	})
}

// restore runs ensure to bring back a resource the health check found not
// running, under its lease: one that showed ready is shown broken with the
// reason first, so clients see the outage; a failed ensure backs off (and
// calls onFail, if set); a resource that still shows broken at the same
// generation afterwards gets show applied. record, if set, runs first in
// that last transaction, with what ensure observed.
func restore[R any](ctx context.Context, e *Engine, k *kind[R], r *R, reason string,
	ensure func() (*dbcloud.Observation, error), show func(r *R, obs *dbcloud.Observation),
	record func(tx dbcloud.Tx, obs *dbcloud.Observation) error, onFail func(err error)) {
	_, id, gen := k.ref(r)
	if st, _ := k.status(r); st == k.ready {
		if err := update(ctx, e, k, r, func(r *R) bool {
			if !k.at(r, gen, k.ready) {
				return false
			}
			k.setStatus(r, k.broken, reason)
			return true
		}, nil); err != nil {
			return
		}
		e.Logger.Warn(k.name+" unhealthy", k.attr, id, "reason", reason)
	}
	fixed, err := ensure()
	if err != nil {
		if ctx.Err() == nil {
			e.backoff(id, 1)
			e.Logger.Warn("repair failed; retrying", k.attr, id, "error", err)
			if onFail != nil {
				onFail(err)
			}
		}
		return
	}
	var then func(tx dbcloud.Tx) error
	if record != nil {
		then = func(tx dbcloud.Tx) error { return record(tx, fixed) }
	}
	update(ctx, e, k, r, func(r *R) bool {
		if !k.at(r, gen, k.broken) {
			return false
		}
		show(r, fixed)
		return true
	}, then)
}
