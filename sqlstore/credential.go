package sqlstore

import "dbcloud"

var dbCredentials = define(entity[dbcloud.Credential]{
	table: "credentials", noun: "credential",
	key: []string{"id", "project_id", "service_id"}, cols: []string{"created"}, set: []string{"created"},
	values: func(c *dbcloud.Credential) []any {
		return []any{c.ID, c.ProjectID, c.ServiceID, formatTime(c.Created)}
	},
})

// InsertCredential adds a credential; ErrDuplicate if the ID exists.
func (t *tx) InsertCredential(c *dbcloud.Credential) error { return dbCredentials.insert(t, c) }

// FindCredential returns a credential of a service.
func (t *tx) FindCredential(projectID, serviceID, id string) (*dbcloud.Credential, error) {
	return dbCredentials.find(t, id, projectID, serviceID)
}

// ListCredentials returns the credentials of a service, of a project
// (serviceID ""), or of every project (both ""), oldest first.
func (t *tx) ListCredentials(projectID, serviceID string) ([]*dbcloud.Credential, error) {
	switch {
	case projectID == "":
		return dbCredentials.list(t, "credentials", `ORDER BY created, id`)
	case serviceID == "":
		return dbCredentials.list(t, "credentials of project "+projectID, `WHERE project_id = ? ORDER BY created, id`, projectID)
	}
	return dbCredentials.list(t, "credentials of service "+serviceID,
		`WHERE project_id = ? AND service_id = ? ORDER BY created, id`, projectID, serviceID)
}

// UpdateCredential replaces a credential; ErrNotFound if it is missing.
func (t *tx) UpdateCredential(c *dbcloud.Credential) error { return dbCredentials.update(t, c) }

// DeleteCredential removes a credential; ErrNotFound if it is missing.
func (t *tx) DeleteCredential(projectID, serviceID, id string) error {
	return dbCredentials.delete(t, nil, id, projectID, serviceID)
}
