package sqlstore

import (
	"fmt"

	"dbcloud"
)

// InsertService adds a service; ErrDuplicate if the ID exists in any project.
func (t *tx) InsertService(s *dbcloud.Service) error {
	t.touch(dbcloud.RevisionServices(s.ProjectID))
	doc, err := encode(s)
	if err != nil {
		return err
	}
	err = t.insert(`INSERT INTO services (id, project_id, created, doc) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		s.ID, s.ProjectID, formatTime(s.Created), doc)
	if err != nil {
		return fmt.Errorf("insert service %s: %w", s.ID, err)
	}
	return nil
}

// FindService returns a service of a project; ErrNotFound if the project
// has no service with that ID.
func (t *tx) FindService(projectID, id string) (*dbcloud.Service, error) {
	s, err := findDoc[dbcloud.Service](t, `SELECT doc FROM services WHERE id = ? AND project_id = ?`+t.forUpdate, id, projectID)
	if err != nil {
		return nil, fmt.Errorf("find service %s: %w", id, err)
	}
	return s, nil
}

// ListServices returns a project's services, oldest first.
func (t *tx) ListServices(projectID string) ([]*dbcloud.Service, error) {
	out, err := listDocs[dbcloud.Service](t, `SELECT doc FROM services WHERE project_id = ? ORDER BY created, id`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list services of project %s: %w", projectID, err)
	}
	return out, nil
}

// UpdateService replaces a service; ErrNotFound if it is missing.
func (t *tx) UpdateService(s *dbcloud.Service) error {
	t.touch(dbcloud.RevisionServices(s.ProjectID))
	doc, err := encode(s)
	if err != nil {
		return err
	}
	err = t.change(`UPDATE services SET created = ?, doc = ? WHERE id = ? AND project_id = ?`,
		formatTime(s.Created), doc, s.ID, s.ProjectID)
	if err != nil {
		return fmt.Errorf("update service %s: %w", s.ID, err)
	}
	return nil
}

// DeleteService removes a service; ErrNotFound if it is missing.
func (t *tx) DeleteService(projectID, id string) error {
	t.touch(dbcloud.RevisionServices(projectID))
	if err := t.change(`DELETE FROM services WHERE id = ? AND project_id = ?`, id, projectID); err != nil {
		return fmt.Errorf("delete service %s: %w", id, err)
	}
	return nil
}

// InsertReplicaSet adds a read replica set; ErrDuplicate if the ID exists.
func (t *tx) InsertReplicaSet(r *dbcloud.ReadReplicaSet) error {
	t.touch(dbcloud.RevisionServices(r.ProjectID))
	doc, err := encode(r)
	if err != nil {
		return err
	}
	err = t.insert(`INSERT INTO replica_sets (id, project_id, service_id, created, doc)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		r.ID, r.ProjectID, r.ServiceID, formatTime(r.Created), doc)
	if err != nil {
		return fmt.Errorf("insert replica set %s: %w", r.ID, err)
	}
	return nil
}

// FindReplicaSet returns a read replica set of a project.
func (t *tx) FindReplicaSet(projectID, id string) (*dbcloud.ReadReplicaSet, error) {
	r, err := findDoc[dbcloud.ReadReplicaSet](t, `SELECT doc FROM replica_sets WHERE id = ? AND project_id = ?`+t.forUpdate, id, projectID)
	if err != nil {
		return nil, fmt.Errorf("find replica set %s: %w", id, err)
	}
	return r, nil
}

// ListReplicaSets returns a project's read replica sets, oldest first; only
// those of serviceID unless it is "".
func (t *tx) ListReplicaSets(projectID, serviceID string) ([]*dbcloud.ReadReplicaSet, error) {
	var (
		out []*dbcloud.ReadReplicaSet
		err error
	)
	if serviceID == "" {
		out, err = listDocs[dbcloud.ReadReplicaSet](t,
			`SELECT doc FROM replica_sets WHERE project_id = ? ORDER BY created, id`, projectID)
	} else {
		out, err = listDocs[dbcloud.ReadReplicaSet](t,
			`SELECT doc FROM replica_sets WHERE project_id = ? AND service_id = ? ORDER BY created, id`, projectID, serviceID)
	}
	if err != nil {
		return nil, fmt.Errorf("list replica sets of project %s: %w", projectID, err)
	}
	return out, nil
}

// UpdateReplicaSet replaces a read replica set; ErrNotFound if it is missing.
func (t *tx) UpdateReplicaSet(r *dbcloud.ReadReplicaSet) error {
	t.touch(dbcloud.RevisionServices(r.ProjectID))
	doc, err := encode(r)
	if err != nil {
		return err
	}
	err = t.change(`UPDATE replica_sets SET service_id = ?, created = ?, doc = ? WHERE id = ? AND project_id = ?`,
		r.ServiceID, formatTime(r.Created), doc, r.ID, r.ProjectID)
	if err != nil {
		return fmt.Errorf("update replica set %s: %w", r.ID, err)
	}
	return nil
}

// DeleteReplicaSet removes a read replica set; ErrNotFound if it is missing.
func (t *tx) DeleteReplicaSet(projectID, id string) error {
	t.touch(dbcloud.RevisionServices(projectID))
	if err := t.change(`DELETE FROM replica_sets WHERE id = ? AND project_id = ?`, id, projectID); err != nil {
		return fmt.Errorf("delete replica set %s: %w", id, err)
	}
	return nil
}
