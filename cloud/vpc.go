package cloud

import (
	"context"
	"fmt"
	"strings"

	"dbcloud"
)

// VPCCreate is a create-VPC request.
type VPCCreate struct {
	Name   string
	CIDR   string
	Region string
}

// PeeringCreate is a create-peering request.
type PeeringCreate struct {
	PeerAccountID  string
	PeerRegionCode string
	PeerVPCID      string
}

// ListVPCs lists the project's VPCs.
func (c *Cloud) ListVPCs(ctx context.Context, projectID string) ([]*dbcloud.VPC, error) {
	var out []*dbcloud.VPC
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		out, err = tx.ListVPCs(projectID)
		return err
	})
	return out, err
}

// GetVPC returns one VPC.
func (c *Cloud) GetVPC(ctx context.Context, projectID, id string) (*dbcloud.VPC, error) {
	var v *dbcloud.VPC
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		v, err = findVPC(tx, projectID, id)
		return err
	})
	return v, err
}

func findVPC(tx dbcloud.Tx, projectID, id string) (*dbcloud.VPC, error) {
	v, err := tx.FindVPC(projectID, id)
	if dbcloud.IsNotFound(err) {
		return nil, dbcloud.Errorf(dbcloud.KindNotFound, "VPC %q not found.", id)
	}
	return v, err
}

// CreateVPC creates a VPC whose CIDR overlaps no other VPC of the project.
func (c *Cloud) CreateVPC(ctx context.Context, projectID string, in VPCCreate) (*dbcloud.VPC, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	var err error
	if in.Name, err = dbcloud.NormalName("name", in.Name); err != nil {
		return nil, err
	}
	cidr, err := dbcloud.ParseCIDR(in.CIDR)
	if err != nil {
		return nil, err
	}
	if in.Region == "" {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "region_code is required; known regions: %s.", strings.Join(c.Config.Regions, ", "))
	}
	region, err := c.resolveRegion(in.Region)
	if err != nil {
		return nil, err
	}
	vpc := &dbcloud.VPC{ID: dbcloud.NewNumericID(), ProjectID: projectID, Name: in.Name, CIDR: cidr, Region: region}
	admit := func(tx dbcloud.Tx) error {
		vpcs, err := tx.ListVPCs(projectID)
		if err != nil {
			return err
		}
		if len(vpcs) >= c.Config.Quotas.VPCs {
			return quotaError("The project already has %d VPCs; the limit is %d.", len(vpcs), c.Config.Quotas.VPCs)
		}
		for _, o := range vpcs {
			if o.CIDR.Overlaps(cidr) {
				return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeCIDRConflict, "cidr %s overlaps %s of VPC %s (%s).", cidr, o.CIDR, o.ID, o.Name)
			}
		}
		return nil
	}
	// The provider is called outside any store transaction: checked
	// first, made in the provider, then recorded (checked again); a record
	// refused meanwhile removes what the provider made.
	if c.Network != nil {
		if err := c.Store.View(ctx, admit); err != nil {
			return nil, err
		}
		vpc.Created = c.now()
		if err := c.Network.CreateVPC(ctx, vpc); err != nil {
			return nil, fmt.Errorf("create VPC %s in the network: %w", vpc.ID, err)
		}
	}
	err = c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		if err := admit(tx); err != nil {
			return err
		}
		vpc.Created = c.now()
		if err := tx.InsertVPC(vpc); err != nil {
			return err
		}
		claim(ctx, "vpc", vpc.ID)
		return nil
	})
	if err != nil {
		if c.Network != nil {
			if derr := c.Network.DeleteVPC(context.WithoutCancel(ctx), vpc); derr != nil {
				c.Logger.Error("remove a VPC whose record was refused", "vpc", vpc.ID, "error", derr)
			}
		}
		return nil, err
	}
	return vpc, nil
}

// RenameVPC changes a VPC's name.
func (c *Cloud) RenameVPC(ctx context.Context, projectID, id, name string) (string, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return "", err
	}
	name, err := dbcloud.NormalName("name", name)
	if err != nil {
		return "", err
	}
	err = c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		v, err := findVPC(tx, projectID, id)
		if err != nil {
			return err
		}
		v.Name = name
		return tx.UpdateVPC(v)
	})
	return fmt.Sprintf("VPC %s renamed.", id), err
}

// DeleteVPC deletes a VPC that has no services and no peerings. The
// provider removes it outside any store transaction, then the record goes;
// if a service was attached meanwhile, the provider makes it again.
func (c *Cloud) DeleteVPC(ctx context.Context, projectID, id string) error {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return err
	}
	var vpc *dbcloud.VPC
	unused := func(tx dbcloud.Tx) (err error) {
		if vpc, err = findVPC(tx, projectID, id); err != nil {
			return err
		}
		var using []string
		svcs, err := tx.ListServices(projectID)
		if err != nil {
			return err
		}
		for _, s := range svcs {
			if s.Spec.VPCID == id || (s.VPCEndpoint != nil && s.VPCEndpoint.VPCID == id) {
				using = append(using, "service "+s.ID)
			}
		}
		peerings, err := tx.ListPeerings(id)
		if err != nil {
			return err
		}
		for _, p := range peerings {
			using = append(using, "peering "+p.ID)
		}
		if len(using) > 0 {
			return dbcloud.Errorf(dbcloud.KindConflict, "VPC %s is still in use; detach or delete first: %s.", id, strings.Join(using, ", "))
		}
		return nil
	}
	if c.Network != nil {
		if err := c.Store.View(ctx, unused); err != nil {
			return err
		}
		if err := c.Network.DeleteVPC(ctx, vpc); err != nil {
			return fmt.Errorf("delete VPC %s in the network: %w", id, err)
		}
	}
	err := c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		if err := unused(tx); err != nil {
			return err
		}
		return tx.DeleteVPC(projectID, id)
	})
	if err != nil && c.Network != nil && vpc != nil && !dbcloud.IsNotFound(err) {
		if cerr := c.Network.CreateVPC(context.WithoutCancel(ctx), vpc); cerr != nil {
			c.Logger.Error("make again a VPC whose delete was refused", "vpc", id, "error", cerr)
		}
	}
	return err
}

// ListPeerings lists a VPC's peerings.
func (c *Cloud) ListPeerings(ctx context.Context, projectID, vpcID string) ([]*dbcloud.Peering, error) {
	var out []*dbcloud.Peering
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) error {
		if _, err := findVPC(tx, projectID, vpcID); err != nil {
			return err
		}
		var err error
		out, err = tx.ListPeerings(vpcID)
		return err
	})
	return out, err
}

// GetPeering returns one peering.
func (c *Cloud) GetPeering(ctx context.Context, projectID, vpcID, id string) (*dbcloud.Peering, error) {
	var p *dbcloud.Peering
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		p, err = findPeering(tx, projectID, vpcID, id)
		return err
	})
	return p, err
}

func findPeering(tx dbcloud.Tx, projectID, vpcID, id string) (*dbcloud.Peering, error) {
	if _, err := findVPC(tx, projectID, vpcID); err != nil {
		return nil, err
	}
	p, err := tx.FindPeering(vpcID, id)
	if dbcloud.IsNotFound(err) {
		return nil, dbcloud.Errorf(dbcloud.KindNotFound, "Peering %q not found.", id)
	}
	return p, err
}

// validatePeerField checks one of the peer's identifiers. Their exact form
// depends on the peer's cloud; the network provider judges that later and
// fails the peering with a message when it refuses.
func validatePeerField(field, s string) error {
	if s == "" {
		return dbcloud.Errorf(dbcloud.KindInvalid, "%s is required.", field)
	}
	if len(s) > 128 || strings.IndexFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
		return dbcloud.Errorf(dbcloud.KindInvalid, "%s must be 1 to 128 printable characters without spaces.", field)
	}
	return nil
}

// CreatePeering records a peering and the operation that provisions it.
func (c *Cloud) CreatePeering(ctx context.Context, projectID, vpcID string, in PeeringCreate) (*dbcloud.Peering, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	for _, f := range []struct{ name, value string }{
		{"peer_account_id", in.PeerAccountID}, {"peer_region_code", in.PeerRegionCode}, {"peer_vpc_id", in.PeerVPCID},
	} {
		if err := validatePeerField(f.name, f.value); err != nil {
			return nil, err
		}
	}
	p := &dbcloud.Peering{
		ID: dbcloud.NewNumericID(), ProjectID: projectID, VPCID: vpcID, PeerAccountID: in.PeerAccountID,
		PeerRegionCode: in.PeerRegionCode, PeerVPCID: in.PeerVPCID, Status: dbcloud.PeeringPending,
	}
	err := c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		if _, err := findVPC(tx, projectID, vpcID); err != nil {
			return err
		}
		existing, err := tx.ListPeerings(vpcID)
		if err != nil {
			return err
		}
		if len(existing) >= c.Config.Quotas.PeeringsPerVPC {
			return quotaError("VPC %s already has %d peerings; the limit is %d.", vpcID, len(existing), c.Config.Quotas.PeeringsPerVPC)
		}
		for _, o := range existing {
			if o.PeerAccountID == p.PeerAccountID && o.PeerRegionCode == p.PeerRegionCode && o.PeerVPCID == p.PeerVPCID {
				return dbcloud.Errorf(dbcloud.KindConflict, "VPC %s already has peering %s with that peer VPC.", vpcID, o.ID)
			}
		}
		p.Created = c.now()
		if err := tx.InsertPeering(p); err != nil {
			return err
		}
		claim(ctx, "peering", p.ID)
		return c.insertChildOperation(ctx, tx, projectID, vpcID, p.ID, dbcloud.OpCreatePeering, 1)
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// DeletePeering moves the peering to deleting; the provider removes it.
func (c *Cloud) DeletePeering(ctx context.Context, projectID, vpcID, id string) error {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return err
	}
	return c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		p, err := findPeering(tx, projectID, vpcID, id)
		if err != nil {
			return err
		}
		if p.Status == dbcloud.PeeringDeleting {
			return nil
		}
		p.Status = dbcloud.PeeringDeleting
		if err := tx.UpdatePeering(p); err != nil {
			return err
		}
		return c.insertChildOperation(ctx, tx, projectID, vpcID, p.ID, dbcloud.OpDeletePeering, 2)
	})
}

// AttachVPC attaches the service to a VPC of its project and region.
func (c *Cloud) AttachVPC(ctx context.Context, projectID, id, vpcID string) (string, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return "", err
	}
	if !dbcloud.IsNumericID(vpcID) {
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "vpc_id %q is not a VPC ID.", vpcID)
	}
	_, err := c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if s.Spec.VPCID == vpcID && s.Status != dbcloud.StatusDeleting {
			return "", nil
		}
		vpc, err := tx.FindVPC(projectID, vpcID)
		if dbcloud.IsNotFound(err) {
			return "", dbcloud.Errorf(dbcloud.KindInvalid, "vpc_id %q does not name a VPC of this project.", vpcID)
		} else if err != nil {
			return "", err
		}
		if s.Spec.VPCID != "" {
			return "", dbcloud.Errorf(dbcloud.KindConflict, "Service %s is already attached to VPC %s; detach it first.", s.ID, s.Spec.VPCID)
		}
		if vpc.Region != s.Region {
			return "", dbcloud.Errorf(dbcloud.KindInvalid, "VPC %s is in region %s but service %s is in %s; they must be in the same region.", vpc.ID, vpc.Region, s.ID, s.Region)
		}
		if err := busy(tx, s); err != nil {
			return "", err
		}
		if err := dbcloud.AttachVPC.Check(s); err != nil {
			return "", err
		}
		s.Spec.VPCID = vpcID
		dbcloud.AttachVPC.Apply(s)
		return dbcloud.OpAttachVPC, nil
	})
	return fmt.Sprintf("Service %s is being attached to VPC %s.", id, vpcID), err
}

// DetachVPC detaches the service from the VPC it is attached to.
func (c *Cloud) DetachVPC(ctx context.Context, projectID, id, vpcID string) (string, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return "", err
	}
	if !dbcloud.IsNumericID(vpcID) {
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "vpc_id %q is not a VPC ID.", vpcID)
	}
	_, err := c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if s.Spec.VPCID == "" {
			if _, err := tx.FindVPC(projectID, vpcID); err != nil {
				if dbcloud.IsNotFound(err) {
					return "", dbcloud.Errorf(dbcloud.KindInvalid, "vpc_id %q does not name a VPC of this project.", vpcID)
				}
				return "", err
			}
			return "", nil // not attached: already in effect
		}
		if s.Spec.VPCID != vpcID {
			return "", dbcloud.Errorf(dbcloud.KindInvalid, "Service %s is attached to VPC %s, not %s.", s.ID, s.Spec.VPCID, vpcID)
		}
		if err := busy(tx, s); err != nil {
			return "", err
		}
		if err := dbcloud.DetachVPC.Check(s); err != nil {
			return "", err
		}
		s.Spec.VPCID = ""
		dbcloud.DetachVPC.Apply(s)
		return dbcloud.OpDetachVPC, nil
	})
	return fmt.Sprintf("Service %s is being detached from VPC %s.", id, vpcID), err
}
