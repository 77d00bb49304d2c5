package sqlstore

import (
	"fmt"

	"dbcloud"
)

var services = define(entity[dbcloud.Service]{
	table: "services", noun: "service",
	key: []string{"id", "project_id"}, cols: []string{"created", "pg_version"}, set: []string{"created", "pg_version"},
	values: func(s *dbcloud.Service) []any {
		return []any{s.ID, s.ProjectID, formatTime(s.Created), s.Spec.PGVersion}
	},
	scopes: func(s *dbcloud.Service) []string { return serviceScopes(s.ProjectID, s.ID) },
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
	return services.delete(t, serviceScopes(projectID, id), id, projectID)
}

var replicaSets = define(entity[dbcloud.ReadReplicaSet]{
	table: "replica_sets", noun: "replica set",
	key:  []string{"id", "project_id"},
	cols: []string{"service_id", "created"}, set: []string{"service_id", "created"},
	values: func(r *dbcloud.ReadReplicaSet) []any {
		return []any{r.ID, r.ProjectID, r.ServiceID, formatTime(r.Created)}
	},
	// A set is part of its service's view. Its service_id never changes
	// (the engine never moves a set), so the one service is enough.
	scopes: func(r *dbcloud.ReadReplicaSet) []string { return serviceScopes(r.ProjectID, r.ServiceID) },
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
	r, err := t.FindReplicaSet(projectID, id)
	if err != nil {
		return fmt.Errorf("delete replica set %s: %w", id, err)
	}
	return replicaSets.delete(t, serviceScopes(projectID, r.ServiceID), id, projectID)
}

// serviceScopes are the revision scopes a write to a service, or to one of
// its read replica sets, moves: its project's and its own.
func serviceScopes(projectID, serviceID string) []string {
	return []string{dbcloud.RevisionServices(projectID), dbcloud.RevisionService(projectID, serviceID)}
}
