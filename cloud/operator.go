package cloud

import (
	"context"
	"errors"
	"fmt"

	"dbcloud"

	"dbcloud/identity"
)

// What the operator of an installation does from the server's command line
// (dbcloud admin), without an API key: look at a project's services, stop
// them all, tear everything down. Each records operations like the API
// does, requested by the operator, so the engine does the work and the
// history shows who asked.

// OperatorContext returns ctx acting as the installation's operator on
// project p: its owner, as the one who runs the installation is, and
// recorded as "dbcloud admin" in the operations it asks for.
func OperatorContext(ctx context.Context, p *dbcloud.Project) context.Context {
	return NewContextWithPrincipal(ctx, &dbcloud.Principal{Project: p, Roles: map[string]identity.Role{p.ID: identity.Owner}})
}

// operatorRequester names the operator in operations it asks for.
const operatorRequester = "dbcloud admin"

// FindProjectAdmin returns a project by ID, for the operator.
func (c *Cloud) FindProjectAdmin(ctx context.Context, id string) (*dbcloud.Project, error) {
	var p *dbcloud.Project
	err := c.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		p, err = tx.FindProject(id)
		if dbcloud.IsNotFound(err) {
			return dbcloud.Errorf(dbcloud.KindNotFound, "Project %q not found.", id)
		}
		return err
	})
	return p, err
}

// Teardown marks every service and read replica set of every project for
// deletion, whatever its environment (delete protection is for API
// callers; the operator is taking the installation down) and whatever was
// pending for it, which the deletes supersede. It returns how many
// resources it marked; the engine deletes them.
func (c *Cloud) Teardown(ctx context.Context) (int, error) {
	projects, err := c.ListProjectsAdmin(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range projects {
		pctx := OperatorContext(ctx, p)
		err := c.update(pctx, p.ID, func(tx dbcloud.Tx) error {
			sets, err := tx.ListReplicaSets(p.ID, "")
			if err != nil {
				return err
			}
			for _, r := range sets {
				if r.Status == dbcloud.ReplicaSetDeleting {
					continue
				}
				if err := c.supersedePending(tx, r.ID); err != nil {
					return err
				}
				r.Status, r.StatusReason = dbcloud.ReplicaSetDeleting, ""
				r.Generation++
				if err := tx.UpdateReplicaSet(r); err != nil {
					return err
				}
				if err := c.insertChildOperation(pctx, tx, p.ID, r.ServiceID, r.ID, dbcloud.OpDeleteReplicaSet, r.Generation); err != nil {
					return err
				}
				n++
			}
			svcs, err := tx.ListServices(p.ID)
			if err != nil {
				return err
			}
			for _, s := range svcs {
				if s.Status == dbcloud.StatusDeleting {
					continue
				}
				if err := c.supersedePending(tx, s.ID); err != nil {
					return err
				}
				dbcloud.Delete.Apply(s)
				s.StatusReason = ""
				s.Generation++
				if err := tx.UpdateService(s); err != nil {
					return err
				}
				if err := c.insertOperation(pctx, tx, p.ID, s.ID, dbcloud.OpDeleteService, s.Generation); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		if err != nil {
			return n, fmt.Errorf("tear down project %s: %w", p.ID, err)
		}
	}
	return n, nil
}

// Remaining counts the services and read replica sets of every project,
// and the operations still pending, so the operator can wait for a
// teardown or a stop to finish.
func (c *Cloud) Remaining(ctx context.Context) (resources, pending int, err error) {
	err = c.Store.View(ctx, func(tx dbcloud.Tx) error {
		projects, err := tx.ListProjects()
		if err != nil {
			return err
		}
		for _, p := range projects {
			svcs, err := tx.ListServices(p.ID)
			if err != nil {
				return err
			}
			sets, err := tx.ListReplicaSets(p.ID, "")
			if err != nil {
				return err
			}
			resources += len(svcs) + len(sets)
		}
		ops, err := tx.ListOperations(dbcloud.OperationFilter{Pending: true})
		pending = len(ops)
		return err
	})
	return resources, pending, err
}

// StopAll asks every running service of every project to stop, as the API's
// stop would (data kept; started again through the API). A service busy
// with another change is stopped once that ends: the stop supersedes
// nothing. It returns how many stops it recorded.
func (c *Cloud) StopAll(ctx context.Context) (int, error) {
	projects, err := c.ListProjectsAdmin(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, p := range projects {
		pctx := OperatorContext(ctx, p)
		vs, err := c.ListServices(pctx, p.ID)
		if err != nil {
			return n, err
		}
		for _, v := range vs {
			s := v.Service
			if !s.Spec.Running || s.Status == dbcloud.StatusDeleting {
				continue
			}
			if _, err := c.StopService(pctx, p.ID, s.ID); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", s.ID, err))
				continue
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}

// RunningServices counts the services of every project whose compute runs
// or is still being stopped, and the operations still pending.
func (c *Cloud) RunningServices(ctx context.Context) (running, pending int, err error) {
	err = c.Store.View(ctx, func(tx dbcloud.Tx) error {
		projects, err := tx.ListProjects()
		if err != nil {
			return err
		}
		for _, p := range projects {
			svcs, err := tx.ListServices(p.ID)
			if err != nil {
				return err
			}
			for _, s := range svcs {
				if s.Status != dbcloud.StatusPaused {
					running++
				}
			}
		}
		ops, err := tx.ListOperations(dbcloud.OperationFilter{Pending: true})
		pending = len(ops)
		return err
	})
	return running, pending, err
}
