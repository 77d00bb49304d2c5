package sqlstore

import (
	"database/sql"
	"fmt"
	"strings"

	"dbcloud"
)

// Users keep PasswordHash in a column of its own, like API keys' secret
// hashes, and their e-mail address in one with a unique index on its lower
// case, so one address is one user whatever its spelling.

// InsertUser adds a user; ErrDuplicate if the ID or e-mail exists.
func (t *tx) InsertUser(u *dbcloud.User) error {
	t.touch(dbcloud.RevisionCredentials)
	doc, err := encode(u)
	if err != nil {
		return err
	}
	err = t.insert(`INSERT INTO users (id, created, email, password_hash, doc) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		u.ID, formatTime(u.Created), strings.ToLower(u.Email), u.PasswordHash, doc)
	if err != nil {
		return fmt.Errorf("insert user %s: %w", u.ID, err)
	}
	return nil
}

// FindUser returns a user by ID.
func (t *tx) FindUser(id string) (*dbcloud.User, error) {
	return t.findUser(`SELECT doc, password_hash FROM users WHERE id = ?`+t.forUpdate, id)
}

// FindUserByEmail returns a user by e-mail address, ignoring case.
func (t *tx) FindUserByEmail(email string) (*dbcloud.User, error) {
	return t.findUser(`SELECT doc, password_hash FROM users WHERE email = ?`+t.forUpdate, strings.ToLower(email))
}

func (t *tx) findUser(query string, arg string) (*dbcloud.User, error) {
	us, err := t.listUsers(query, arg)
	if err == nil && len(us) == 0 {
		err = dbcloud.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find user %s: %w", arg, err)
	}
	return us[0], nil
}

// ListUsers returns all users, oldest first.
func (t *tx) ListUsers() ([]*dbcloud.User, error) {
	out, err := t.listUsers(`SELECT doc, password_hash FROM users ORDER BY created, id`)
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	return out, nil
}

func (t *tx) listUsers(query string, args ...any) ([]*dbcloud.User, error) {
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []*dbcloud.User{}
	var doc sql.RawBytes
	for rows.Next() {
		var hash sql.NullString
		if err := rows.Scan(&doc, &hash); err != nil {
			return nil, err
		}
		u, err := decode[dbcloud.User](doc)
		if err != nil {
			return nil, err
		}
		u.PasswordHash = hash.String
		out = append(out, u)
	}
	return out, rows.Err()
}

// UpdateUser replaces a user; ErrNotFound if missing.
func (t *tx) UpdateUser(u *dbcloud.User) error {
	t.touch(dbcloud.RevisionCredentials)
	doc, err := encode(u)
	if err != nil {
		return err
	}
	err = t.change(`UPDATE users SET email = ?, password_hash = ?, doc = ? WHERE id = ?`,
		strings.ToLower(u.Email), u.PasswordHash, doc, u.ID)
	if err != nil {
		return fmt.Errorf("update user %s: %w", u.ID, err)
	}
	return nil
}

// InsertProject adds a project; ErrDuplicate if the ID exists.
func (t *tx) InsertProject(p *dbcloud.Project) error {
	t.touch(dbcloud.RevisionCredentials)
	doc, err := encode(p)
	if err != nil {
		return err
	}
	err = t.insert(`INSERT INTO projects (id, created, doc) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`,
		p.ID, formatTime(p.Created), doc)
	if err != nil {
		return fmt.Errorf("insert project %s: %w", p.ID, err)
	}
	return nil
}

// FindProject returns a project by ID.
func (t *tx) FindProject(id string) (*dbcloud.Project, error) {
	p, err := findDoc[dbcloud.Project](t, `SELECT doc FROM projects WHERE id = ?`+t.forUpdate, id)
	if err != nil {
		return nil, fmt.Errorf("find project %s: %w", id, err)
	}
	return p, nil
}

// ListProjects returns all projects, oldest first.
func (t *tx) ListProjects() ([]*dbcloud.Project, error) {
	out, err := listDocs[dbcloud.Project](t, `SELECT doc FROM projects ORDER BY created, id`)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	return out, nil
}

// UpdateProject replaces a project's document; ErrNotFound if it is gone.
func (t *tx) UpdateProject(p *dbcloud.Project) error {
	t.touch(dbcloud.RevisionCredentials)
	doc, err := encode(p)
	if err != nil {
		return err
	}
	if err := t.change(`UPDATE projects SET doc = ? WHERE id = ?`, doc, p.ID); err != nil {
		return fmt.Errorf("update project %s: %w", p.ID, err)
	}
	return nil
}

// LockProject holds the dialect's project lock until the transaction ends.
// The project need not exist: the lock is on the ID, so that it also guards
// the creation of the project's first rows.
func (t *tx) LockProject(id string) error {
	if t.s.dialect.LockProject == nil {
		return nil
	}
	if err := t.s.dialect.LockProject(t.ctx, t.tx, id); err != nil {
		return fmt.Errorf("lock project %s: %w", id, err)
	}
	return nil
}

// API keys keep SecretHash in a column of its own: the struct hides it from
// JSON (json:"-") so that no encoder can ever leak it, the doc included.

// InsertAPIKey adds a key; ErrDuplicate if the access key exists.
func (t *tx) InsertAPIKey(k *dbcloud.APIKey) error {
	t.touch(dbcloud.RevisionCredentials)
	doc, err := encode(k)
	if err != nil {
		return err
	}
	err = t.insert(`INSERT INTO api_keys (access_key, project_id, created, secret_hash, doc)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		k.AccessKey, k.ProjectID, formatTime(k.Created), k.SecretHash, doc)
	if err != nil {
		return fmt.Errorf("insert api key %s: %w", k.AccessKey, err)
	}
	return nil
}

// FindAPIKey returns a key by its access key.
func (t *tx) FindAPIKey(accessKey string) (*dbcloud.APIKey, error) {
	keys, err := t.listAPIKeys(`SELECT doc, secret_hash FROM api_keys WHERE access_key = ?`+t.forUpdate, accessKey)
	if err == nil && len(keys) == 0 {
		err = dbcloud.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find api key %s: %w", accessKey, err)
	}
	return keys[0], nil
}

// ListAPIKeys returns a project's keys, oldest first.
func (t *tx) ListAPIKeys(projectID string) ([]*dbcloud.APIKey, error) {
	keys, err := t.listAPIKeys(`SELECT doc, secret_hash FROM api_keys WHERE project_id = ?
		ORDER BY created, access_key`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list api keys of project %s: %w", projectID, err)
	}
	return keys, nil
}

func (t *tx) listAPIKeys(query string, args ...any) ([]*dbcloud.APIKey, error) {
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []*dbcloud.APIKey{}
	var doc sql.RawBytes
	for rows.Next() {
		var hash []byte
		if err := rows.Scan(&doc, &hash); err != nil {
			return nil, err
		}
		k, err := decode[dbcloud.APIKey](doc)
		if err != nil {
			return nil, err
		}
		k.SecretHash = hash
		out = append(out, k)
	}
	return out, rows.Err()
}

// UpdateAPIKey replaces a key, found by access key; ErrNotFound if missing.
func (t *tx) UpdateAPIKey(k *dbcloud.APIKey) error {
	t.touch(dbcloud.RevisionCredentials)
	doc, err := encode(k)
	if err != nil {
		return err
	}
	err = t.change(`UPDATE api_keys SET project_id = ?, created = ?, secret_hash = ?, doc = ? WHERE access_key = ?`,
		k.ProjectID, formatTime(k.Created), k.SecretHash, doc, k.AccessKey)
	if err != nil {
		return fmt.Errorf("update api key %s: %w", k.AccessKey, err)
	}
	return nil
}
