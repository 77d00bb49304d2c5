package sqlstore

import (
	"database/sql"
	"fmt"
	"strings"
	"time"

	"dbcloud"
)

// credentials is the revision scope of every write in this file.
func credentials[T any](*T) []string { return []string{dbcloud.RevisionCredentials} }

// Users keep PasswordHash in a column of its own, like API keys' secret
// hashes, and their e-mail address in one with a unique index on its lower
// case, so one address is one user whatever its spelling.
var users = define(entity[dbcloud.User]{
	table: "users", noun: "user",
	key:  []string{"id"},
	cols: []string{"created", "email", "password_hash"}, set: []string{"email", "password_hash"},
	values: func(u *dbcloud.User) []any {
		return []any{u.ID, formatTime(u.Created), strings.ToLower(u.Email), u.PasswordHash}
	},
	read:   "doc, password_hash",
	scan:   scanDocAnd(func(u *dbcloud.User, hash sql.NullString) { u.PasswordHash = hash.String }),
	scopes: credentials[dbcloud.User],
})

// InsertUser adds a user; ErrDuplicate if the ID or e-mail exists.
func (t *tx) InsertUser(u *dbcloud.User) error { return users.insert(t, u) }

// FindUser returns a user by ID.
func (t *tx) FindUser(id string) (*dbcloud.User, error) { return users.find(t, id) }

// FindUserByEmail returns a user by e-mail address, ignoring case.
func (t *tx) FindUserByEmail(email string) (*dbcloud.User, error) {
	email = strings.ToLower(email)
	return users.findWhere(t, "user "+email, `email = ?`, email)
}

// ListUsers returns all users, oldest first.
func (t *tx) ListUsers() ([]*dbcloud.User, error) {
	return users.list(t, "users", `ORDER BY created, id`)
}

// UpdateUser replaces a user; ErrNotFound if missing.
func (t *tx) UpdateUser(u *dbcloud.User) error { return users.update(t, u) }

var projects = define(entity[dbcloud.Project]{
	table: "projects", noun: "project",
	key: []string{"id"}, cols: []string{"created"},
	values: func(p *dbcloud.Project) []any { return []any{p.ID, formatTime(p.Created)} },
	scopes: credentials[dbcloud.Project],
})

// InsertProject adds a project; ErrDuplicate if the ID exists.
func (t *tx) InsertProject(p *dbcloud.Project) error { return projects.insert(t, p) }

// FindProject returns a project by ID.
func (t *tx) FindProject(id string) (*dbcloud.Project, error) { return projects.find(t, id) }

// ListProjects returns all projects, oldest first.
func (t *tx) ListProjects() ([]*dbcloud.Project, error) {
	return projects.list(t, "projects", `ORDER BY created, id`)
}

// UpdateProject replaces a project's document; ErrNotFound if it is gone.
func (t *tx) UpdateProject(p *dbcloud.Project) error { return projects.update(t, p) }

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
var apiKeys = define(entity[dbcloud.APIKey]{
	table: "api_keys", noun: "api key",
	key:  []string{"access_key"},
	cols: []string{"project_id", "created", "secret_hash"}, set: []string{"project_id", "created", "secret_hash"},
	values: func(k *dbcloud.APIKey) []any {
		return []any{k.AccessKey, k.ProjectID, formatTime(k.Created), k.SecretHash}
	},
	read:   "doc, secret_hash, last_used",
	scan:   scanAPIKey,
	scopes: credentials[dbcloud.APIKey],
})

// scanAPIKey reads a key's doc and the two columns kept out of it.
func scanAPIKey(rows *sql.Rows) (*dbcloud.APIKey, error) {
	var (
		doc      sql.RawBytes
		hash     []byte
		lastUsed sql.NullString
	)
	if err := rows.Scan(&doc, &hash, &lastUsed); err != nil {
		return nil, err
	}
	k, err := decode[dbcloud.APIKey](doc)
	if err != nil {
		return nil, err
	}
	k.SecretHash = hash
	if lastUsed.Valid {
		at, err := time.Parse(timeLayout, lastUsed.String)
		if err != nil {
			return nil, fmt.Errorf("last use of api key %s: %w", k.AccessKey, err)
		}
		k.LastUsed = &at
	}
	return k, nil
}

// TouchAPIKey records the key's use at, if later than the one recorded.
// It touches no revision scope: a key's last use is not part of what
// authentication checks, and moving RevisionCredentials would make every
// control plane check every credential again.
func (t *tx) TouchAPIKey(accessKey string, at time.Time) error {
	when := formatTime(at)
	_, err := t.exec(`UPDATE api_keys SET last_used = ? WHERE access_key = ? AND (last_used IS NULL OR last_used < ?)`, when, accessKey, when)
	if err != nil {
		return fmt.Errorf("record use of api key %s: %w", accessKey, err)
	}
	return nil
}

// InsertAPIKey adds a key; ErrDuplicate if the access key exists.
func (t *tx) InsertAPIKey(k *dbcloud.APIKey) error { return apiKeys.insert(t, k) }

// FindAPIKey returns a key by its access key.
func (t *tx) FindAPIKey(accessKey string) (*dbcloud.APIKey, error) { return apiKeys.find(t, accessKey) }

// ListAPIKeys returns a project's keys, oldest first.
func (t *tx) ListAPIKeys(projectID string) ([]*dbcloud.APIKey, error) {
	return apiKeys.list(t, "api keys of project "+projectID,
		`WHERE project_id = ? ORDER BY created, access_key`, projectID)
}

// UpdateAPIKey replaces a key, found by access key; ErrNotFound if missing.
func (t *tx) UpdateAPIKey(k *dbcloud.APIKey) error { return apiKeys.update(t, k) }
