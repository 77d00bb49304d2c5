package engine

import (
	"context"
	"fmt"

	"dbcloud"
)

// reconcilePeering makes a peering real through the network provider, or
// removes it: pending becomes active (with the provider's identifier) or
// failed (with the provider's reason); deleting ends with the row gone.
func (e *Engine) reconcilePeering(ctx context.Context, projectID, id string) error {
	if e.Network == nil {
		return nil
	}
	vpc, p, err := e.findPeering(ctx, projectID, id)
	if err != nil {
		return err
	}
	if p == nil {
		return e.finishOperations(ctx, id, 0, dbcloud.OpSucceeded, "")
	}
	if p.Status == dbcloud.PeeringDeleting {
		if err := e.Network.DeletePeering(ctx, vpc, p); err != nil {
			return e.peeringFailed(ctx, p, err)
		}
		err := e.Store.Update(ctx, func(tx dbcloud.Tx) error {
			if err := tx.DeletePeering(p.VPCID, p.ID); err != nil && !dbcloud.IsNotFound(err) {
				return err
			}
			return finishOperationsTx(tx, id, 0, dbcloud.OpSucceeded, "", e.now())
		})
		if err == nil {
			e.Logger.Info("peering deleted", "peering", id, "vpc", vpc.ID)
		}
		return err
	}
	if p.Status == dbcloud.PeeringActive || p.Status == dbcloud.PeeringFailed {
		return e.finishOperations(ctx, id, 0, dbcloud.OpSucceeded, "")
	}
	provisioned, err := e.Network.CreatePeering(ctx, vpc, p)
	if err != nil {
		return e.peeringFailed(ctx, p, err)
	}
	e.clearBackoff(id)
	return e.setPeering(ctx, p, dbcloud.PeeringActive, provisioned, "", dbcloud.OpSucceeded)
}

// peeringFailed retries what may pass, and fails the peering with the
// provider's reason when it refused.
func (e *Engine) peeringFailed(ctx context.Context, p *dbcloud.Peering, cause error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	attempts, err := e.countAttempt(ctx, p.ID, cause)
	if err != nil {
		return err
	}
	if !dbcloud.IsTerminal(cause) && attempts < e.MaxAttempts {
		e.backoff(p.ID, attempts)
		return fmt.Errorf("peering %s: %w", p.ID, cause)
	}
	e.clearBackoff(p.ID)
	if p.Status == dbcloud.PeeringDeleting {
		// A delete the provider refuses stays deleting, with the reason.
		return e.setPeering(ctx, p, dbcloud.PeeringDeleting, p.ProvisionedID, reasonOf(cause), dbcloud.OpFailed)
	}
	return e.setPeering(ctx, p, dbcloud.PeeringFailed, "", reasonOf(cause), dbcloud.OpFailed)
}

func (e *Engine) setPeering(ctx context.Context, p *dbcloud.Peering, status dbcloud.PeeringStatus, provisioned, msg string, opState dbcloud.OperationState) error {
	return e.Store.Update(ctx, func(tx dbcloud.Tx) error {
		cur, err := tx.FindPeering(p.VPCID, p.ID)
		if dbcloud.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		if cur.Status == dbcloud.PeeringDeleting && status != dbcloud.PeeringDeleting {
			return nil // deleted meanwhile: the delete operation decides
		}
		cur.Status, cur.ProvisionedID, cur.ErrorMessage = status, provisioned, msg
		if err := tx.UpdatePeering(cur); err != nil {
			return err
		}
		e.Logger.Info("peering status", "peering", p.ID, "status", status, "reason", msg)
		return finishOperationsTx(tx, p.ID, 0, opState, msg, e.now())
	})
}

// findPeering looks for the peering among the project's VPCs: operations
// name the peering, not its VPC.
func (e *Engine) findPeering(ctx context.Context, projectID, id string) (*dbcloud.VPC, *dbcloud.Peering, error) {
	var (
		vpc *dbcloud.VPC
		p   *dbcloud.Peering
	)
	err := e.Store.View(ctx, func(tx dbcloud.Tx) error {
		vpcs, err := tx.ListVPCs(projectID)
		if err != nil {
			return err
		}
		for _, v := range vpcs {
			found, err := tx.FindPeering(v.ID, id)
			if dbcloud.IsNotFound(err) {
				continue
			} else if err != nil {
				return err
			}
			vpc, p = v, found
			return nil
		}
		return nil
	})
	return vpc, p, err
}
