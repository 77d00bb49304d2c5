package sqlstore

import (
	"fmt"

	"dbcloud"
)

// InsertCredential adds a credential; ErrDuplicate if the ID exists.
func (t *tx) InsertCredential(c *dbcloud.Credential) error {
	doc, err := encode(c)
	if err != nil {
		return err
	}
	err = t.insert(`INSERT INTO credentials (id, project_id, service_id, created, doc) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		c.ID, c.ProjectID, c.ServiceID, formatTime(c.Created), doc)
	if err != nil {
		return fmt.Errorf("insert credential %s: %w", c.ID, err)
	}
	return nil
}

// FindCredential returns a credential of a service.
func (t *tx) FindCredential(projectID, serviceID, id string) (*dbcloud.Credential, error) {
	c, err := findDoc[dbcloud.Credential](t, `SELECT doc FROM credentials WHERE id = ? AND project_id = ? AND service_id = ?`+t.forUpdate,
		id, projectID, serviceID)
	if err != nil {
		return nil, fmt.Errorf("find credential %s: %w", id, err)
	}
	return c, nil
}

// ListCredentials returns the credentials of a service, of a project
// (serviceID ""), or of every project (both ""), oldest first.
func (t *tx) ListCredentials(projectID, serviceID string) ([]*dbcloud.Credential, error) {
	q, args := `SELECT doc FROM credentials`, []any{}
	switch {
	case projectID == "":
	case serviceID == "":
		q, args = q+` WHERE project_id = ?`, append(args, projectID)
	default:
		q, args = q+` WHERE project_id = ? AND service_id = ?`, append(args, projectID, serviceID)
	}
	out, err := listDocs[dbcloud.Credential](t, q+` ORDER BY created, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list credentials: %w", err)
	}
	return out, nil
}

// UpdateCredential replaces a credential; ErrNotFound if it is missing.
func (t *tx) UpdateCredential(c *dbcloud.Credential) error {
	doc, err := encode(c)
	if err != nil {
		return err
	}
	err = t.change(`UPDATE credentials SET created = ?, doc = ? WHERE id = ? AND project_id = ? AND service_id = ?`,
		formatTime(c.Created), doc, c.ID, c.ProjectID, c.ServiceID)
	if err != nil {
		return fmt.Errorf("update credential %s: %w", c.ID, err)
	}
	return nil
}

// DeleteCredential removes a credential; ErrNotFound if it is missing.
func (t *tx) DeleteCredential(projectID, serviceID, id string) error {
	if err := t.change(`DELETE FROM credentials WHERE id = ? AND project_id = ? AND service_id = ?`, id, projectID, serviceID); err != nil {
		return fmt.Errorf("delete credential %s: %w", id, err)
	}
	return nil
}
