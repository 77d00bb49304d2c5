package sqlstore

import "dbcloud"

var services = define(entity[dbcloud.Service]{
	table: "services", noun: "service",
	key: []string{"id", "project_id"}, cols: []string{"created", "pg_version"}, set: []string{"created", "pg_version"},
	values: func(s *dbcloud.Service) []any {
		return []any{s.ID, s.ProjectID, formatTime(s.Created), s.Spec.PGVersion}
	},
	scope: func(s *dbcloud.Service) string { return dbcloud.RevisionServices(s.ProjectID) },
})

// InsertService adds a service; ErrDuplicate if the ID exists in any project.
func (t *tx) InsertService(s *dbcloud.Service) error { return services.insert(t, s) }

// FindService returns a service of a project; ErrNotFound if the project
// has no service with that ID.
func (t *tx) FindService(projectID, id string) (*dbcloud.Service, error) {
	return services.find(t, id, projectID)
}

// ListServices returns a project's services, oldest first.
func (t *tx) ListServices(projectID string) ([]*dbcloud.Service, error) {
	return services.list(t, "services of project "+projectID, `WHERE project_id = ? ORDER BY created, id`, projectID)
}

// UpdateService replaces a service; ErrNotFound if it is missing.
func (t *tx) UpdateService(s *dbcloud.Service) error { return services.update(t, s) }

// DeleteService removes a service; ErrNotFound if it is missing.
func (t *tx) DeleteService(projectID, id string) error {
	return services.delete(t, dbcloud.RevisionServices(projectID), id, projectID)
}

var replicaSets = define(entity[dbcloud.ReadReplicaSet]{
	table: "replica_sets", noun: "replica set",
	key:  []string{"id", "project_id"},
	cols: []string{"service_id", "created"}, set: []string{"service_id", "created"},
	values: func(r *dbcloud.ReadReplicaSet) []any {
		return []any{r.ID, r.ProjectID, r.ServiceID, formatTime(r.Created)}
	},
	scope: func(r *dbcloud.ReadReplicaSet) string { return dbcloud.RevisionServices(r.ProjectID) },
})

// InsertReplicaSet adds a read replica set; ErrDuplicate if the ID exists.
func (t *tx) InsertReplicaSet(r *dbcloud.ReadReplicaSet) error { return replicaSets.insert(t, r) }

// FindReplicaSet returns a read replica set of a project.
func (t *tx) FindReplicaSet(projectID, id string) (*dbcloud.ReadReplicaSet, error) {
	return replicaSets.find(t, id, projectID)
}

// ListReplicaSets returns a project's read replica sets, oldest first; only
// those of serviceID unless it is "".
func (t *tx) ListReplicaSets(projectID, serviceID string) ([]*dbcloud.ReadReplicaSet, error) {
	what := "replica sets of project " + projectID
	if serviceID == "" {
		return replicaSets.list(t, what, `WHERE project_id = ? ORDER BY created, id`, projectID)
	}
	return replicaSets.list(t, what, `WHERE project_id = ? AND service_id = ? ORDER BY created, id`, projectID, serviceID)
}

// UpdateReplicaSet replaces a read replica set; ErrNotFound if it is missing.
func (t *tx) UpdateReplicaSet(r *dbcloud.ReadReplicaSet) error { return replicaSets.update(t, r) }

// DeleteReplicaSet removes a read replica set; ErrNotFound if it is missing.
func (t *tx) DeleteReplicaSet(projectID, id string) error {
	return replicaSets.delete(t, dbcloud.RevisionServices(projectID), id, projectID)
}
