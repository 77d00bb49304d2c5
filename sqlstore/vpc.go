package sqlstore

import (
	"fmt"

	"dbcloud"
)

// InsertVPC adds a VPC; ErrDuplicate if the ID exists.
func (t *tx) InsertVPC(v *dbcloud.VPC) error {
	doc, err := encode(v)
	if err != nil {
		return err
	}
	err = t.insert(`INSERT INTO vpcs (id, project_id, created, doc) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		v.ID, v.ProjectID, formatTime(v.Created), doc)
	if err != nil {
		return fmt.Errorf("insert vpc %s: %w", v.ID, err)
	}
	return nil
}

// FindVPC returns a VPC of a project.
func (t *tx) FindVPC(projectID, id string) (*dbcloud.VPC, error) {
	v, err := findDoc[dbcloud.VPC](t, `SELECT doc FROM vpcs WHERE id = ? AND project_id = ?`+t.forUpdate, id, projectID)
	if err != nil {
		return nil, fmt.Errorf("find vpc %s: %w", id, err)
	}
	return v, nil
}

// ListVPCs returns a project's VPCs, oldest first.
func (t *tx) ListVPCs(projectID string) ([]*dbcloud.VPC, error) {
	out, err := listDocs[dbcloud.VPC](t, `SELECT doc FROM vpcs WHERE project_id = ? ORDER BY created, id`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list vpcs of project %s: %w", projectID, err)
	}
	return out, nil
}

// UpdateVPC replaces a VPC; ErrNotFound if it is missing.
func (t *tx) UpdateVPC(v *dbcloud.VPC) error {
	doc, err := encode(v)
	if err != nil {
		return err
	}
	err = t.change(`UPDATE vpcs SET created = ?, doc = ? WHERE id = ? AND project_id = ?`,
		formatTime(v.Created), doc, v.ID, v.ProjectID)
	if err != nil {
		return fmt.Errorf("update vpc %s: %w", v.ID, err)
	}
	return nil
}

// DeleteVPC removes a VPC; ErrNotFound if it is missing. Its peerings are
// not touched: the domain refuses to delete a VPC that has any.
func (t *tx) DeleteVPC(projectID, id string) error {
	if err := t.change(`DELETE FROM vpcs WHERE id = ? AND project_id = ?`, id, projectID); err != nil {
		return fmt.Errorf("delete vpc %s: %w", id, err)
	}
	return nil
}

// InsertPeering adds a peering; ErrDuplicate if the ID exists.
func (t *tx) InsertPeering(p *dbcloud.Peering) error {
	doc, err := encode(p)
	if err != nil {
		return err
	}
	err = t.insert(`INSERT INTO peerings (id, project_id, vpc_id, created, doc) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		p.ID, p.ProjectID, p.VPCID, formatTime(p.Created), doc)
	if err != nil {
		return fmt.Errorf("insert peering %s: %w", p.ID, err)
	}
	return nil
}

// FindPeering returns a peering of a VPC.
func (t *tx) FindPeering(vpcID, id string) (*dbcloud.Peering, error) {
	p, err := findDoc[dbcloud.Peering](t, `SELECT doc FROM peerings WHERE id = ? AND vpc_id = ?`+t.forUpdate, id, vpcID)
	if err != nil {
		return nil, fmt.Errorf("find peering %s: %w", id, err)
	}
	return p, nil
}

// ListPeerings returns a VPC's peerings, oldest first.
func (t *tx) ListPeerings(vpcID string) ([]*dbcloud.Peering, error) {
	out, err := listDocs[dbcloud.Peering](t, `SELECT doc FROM peerings WHERE vpc_id = ? ORDER BY created, id`, vpcID)
	if err != nil {
		return nil, fmt.Errorf("list peerings of vpc %s: %w", vpcID, err)
	}
	return out, nil
}

// UpdatePeering replaces a peering; ErrNotFound if it is missing.
func (t *tx) UpdatePeering(p *dbcloud.Peering) error {
	doc, err := encode(p)
	if err != nil {
		return err
	}
	err = t.change(`UPDATE peerings SET project_id = ?, created = ?, doc = ? WHERE id = ? AND vpc_id = ?`,
		p.ProjectID, formatTime(p.Created), doc, p.ID, p.VPCID)
	if err != nil {
		return fmt.Errorf("update peering %s: %w", p.ID, err)
	}
	return nil
}

// DeletePeering removes a peering; ErrNotFound if it is missing.
func (t *tx) DeletePeering(vpcID, id string) error {
	if err := t.change(`DELETE FROM peerings WHERE id = ? AND vpc_id = ?`, id, vpcID); err != nil {
		return fmt.Errorf("delete peering %s: %w", id, err)
	}
	return nil
}
