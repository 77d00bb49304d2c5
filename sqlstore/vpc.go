package sqlstore

import "dbcloud"

var vpcs = define(entity[dbcloud.VPC]{
	table: "vpcs", noun: "vpc",
	key: []string{"id", "project_id"}, cols: []string{"created"}, set: []string{"created"},
	values: func(v *dbcloud.VPC) []any { return []any{v.ID, v.ProjectID, formatTime(v.Created)} },
})

// InsertVPC adds a VPC; ErrDuplicate if the ID exists.
func (t *tx) InsertVPC(v *dbcloud.VPC) error { return vpcs.insert(t, v) }

// FindVPC returns a VPC of a project.
func (t *tx) FindVPC(projectID, id string) (*dbcloud.VPC, error) { return vpcs.find(t, id, projectID) }

// ListVPCs returns a project's VPCs, oldest first.
func (t *tx) ListVPCs(projectID string) ([]*dbcloud.VPC, error) {
	return vpcs.list(t, "vpcs of project "+projectID, `WHERE project_id = ? ORDER BY created, id`, projectID)
}

// UpdateVPC replaces a VPC; ErrNotFound if it is missing.
func (t *tx) UpdateVPC(v *dbcloud.VPC) error { return vpcs.update(t, v) }

// DeleteVPC removes a VPC; ErrNotFound if it is missing. Its peerings are
// not touched: the domain refuses to delete a VPC that has any.
func (t *tx) DeleteVPC(projectID, id string) error { return vpcs.delete(t, nil, id, projectID) }

var peerings = define(entity[dbcloud.Peering]{
	table: "peerings", noun: "peering",
	key:  []string{"id", "vpc_id"},
	cols: []string{"project_id", "created"}, set: []string{"project_id", "created"},
	values: func(p *dbcloud.Peering) []any {
		return []any{p.ID, p.VPCID, p.ProjectID, formatTime(p.Created)}
	},
})

// InsertPeering adds a peering; ErrDuplicate if the ID exists.
func (t *tx) InsertPeering(p *dbcloud.Peering) error { return peerings.insert(t, p) }

// FindPeering returns a peering of a VPC.
func (t *tx) FindPeering(vpcID, id string) (*dbcloud.Peering, error) {
	return peerings.find(t, id, vpcID)
}

// ListPeerings returns a VPC's peerings, oldest first.
func (t *tx) ListPeerings(vpcID string) ([]*dbcloud.Peering, error) {
	return peerings.list(t, "peerings of vpc "+vpcID, `WHERE vpc_id = ? ORDER BY created, id`, vpcID)
}

// UpdatePeering replaces a peering; ErrNotFound if it is missing.
func (t *tx) UpdatePeering(p *dbcloud.Peering) error { return peerings.update(t, p) }

// DeletePeering removes a peering; ErrNotFound if it is missing.
func (t *tx) DeletePeering(vpcID, id string) error { return peerings.delete(t, nil, id, vpcID) }
