package cloud

import (
	"context"

	"dbcloud"
	"dbcloud/identity"
)

// CreateOwnProject makes a project for the signed-in person, who becomes
// its owner. How many projects one person may own is bounded
// (Quotas.OwnedProjects): each project has its own quotas, so without a
// bound on projects those would bound nothing.
func (c *Cloud) CreateOwnProject(ctx context.Context, name string) (*dbcloud.Project, error) {
	p := PrincipalFromContext(ctx)
	if p == nil || p.User == nil || p.Key != nil {
		return nil, dbcloud.Errorf(dbcloud.KindForbidden, "Only a signed-in person creates projects; an API key belongs to one project.")
	}
	name, err := dbcloud.NormalName("name", name)
	if err != nil {
		return nil, err
	}
	pr := &dbcloud.Project{ID: dbcloud.NewID(), Name: name, PlanType: "self-hosted", Created: c.now()}
	err = c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		// One person's creations are serialised, so the bound holds
		// under concurrent requests.
		if err := tx.LockProject("owner/" + p.User.ID); err != nil {
			return err
		}
		ms, err := tx.ListMemberships(p.User.ID)
		if err != nil {
			return err
		}
		owned := 0
		for _, m := range ms {
			if m.Role == identity.Owner {
				owned++
			}
		}
		if owned >= c.Config.Quotas.OwnedProjects {
			return dbcloud.Errorf(dbcloud.KindConflict, "You own %d projects, the most one person may (--quota-owned-projects is %d); delete one, or ask the operator.",
				owned, c.Config.Quotas.OwnedProjects)
		}
		if err := tx.InsertProject(pr); err != nil {
			return err
		}
		return c.makeOwner(tx, pr.ID, p.User.ID)
	})
	if err != nil {
		return nil, err
	}
	c.Logger.Info("project created", "project", pr.ID, "user", p.User.ID)
	return pr, nil
}
