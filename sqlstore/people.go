package sqlstore

import (
	"database/sql"
	"fmt"
	"time"

	"dbcloud"
	"dbcloud/identity"
)

// InsertMembership adds a membership; ErrDuplicate if the user is a member.
func (t *tx) InsertMembership(m *dbcloud.Membership) error {
	t.touch(dbcloud.RevisionCredentials)
	err := t.insert(`INSERT INTO memberships (project_id, user_id, role, created) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		m.ProjectID, m.UserID, string(m.Role), formatTime(m.Created))
	if err != nil {
		return fmt.Errorf("insert membership %s/%s: %w", m.ProjectID, m.UserID, err)
	}
	return nil
}

// FindMembership returns the user's membership of the project.
func (t *tx) FindMembership(projectID, userID string) (*dbcloud.Membership, error) {
	ms, err := t.listMemberships(`SELECT project_id, user_id, role, created FROM memberships
		WHERE project_id = ? AND user_id = ?`+t.forUpdate, projectID, userID)
	if err == nil && len(ms) == 0 {
		err = dbcloud.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find membership %s/%s: %w", projectID, userID, err)
	}
	return ms[0], nil
}

// ListMembers lists a project's memberships, oldest first.
func (t *tx) ListMembers(projectID string) ([]*dbcloud.Membership, error) {
	ms, err := t.listMemberships(`SELECT project_id, user_id, role, created FROM memberships
		WHERE project_id = ? ORDER BY created, user_id`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list members of %s: %w", projectID, err)
	}
	return ms, nil
}

// ListMemberships lists a user's memberships, oldest first.
func (t *tx) ListMemberships(userID string) ([]*dbcloud.Membership, error) {
	ms, err := t.listMemberships(`SELECT project_id, user_id, role, created FROM memberships
		WHERE user_id = ? ORDER BY created, project_id`, userID)
	if err != nil {
		return nil, fmt.Errorf("list memberships of %s: %w", userID, err)
	}
	return ms, nil
}

func (t *tx) listMemberships(query string, args ...any) ([]*dbcloud.Membership, error) {
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []*dbcloud.Membership{}
	for rows.Next() {
		var m dbcloud.Membership
		var role, created string
		if err := rows.Scan(&m.ProjectID, &m.UserID, &role, &created); err != nil {
			return nil, err
		}
		m.Role = identity.Role(role)
		if m.Created, err = time.Parse(timeLayout, created); err != nil {
			return nil, err
		}
		out = append(out, &m)
	}
	return out, rows.Err()
}

// UpdateMembership changes a member's role; ErrNotFound if missing.
func (t *tx) UpdateMembership(m *dbcloud.Membership) error {
	t.touch(dbcloud.RevisionCredentials)
	err := t.change(`UPDATE memberships SET role = ? WHERE project_id = ? AND user_id = ?`, string(m.Role), m.ProjectID, m.UserID)
	if err != nil {
		return fmt.Errorf("update membership %s/%s: %w", m.ProjectID, m.UserID, err)
	}
	return nil
}

// DeleteMembership removes a member; ErrNotFound if missing.
func (t *tx) DeleteMembership(projectID, userID string) error {
	t.touch(dbcloud.RevisionCredentials)
	if err := t.change(`DELETE FROM memberships WHERE project_id = ? AND user_id = ?`, projectID, userID); err != nil {
		return fmt.Errorf("delete membership %s/%s: %w", projectID, userID, err)
	}
	return nil
}

// User tokens keep their hash in the key column and out of the doc.

// InsertUserToken adds a token; ErrDuplicate if its hash exists.
func (t *tx) InsertUserToken(u *dbcloud.UserToken) error {
	t.touch(dbcloud.RevisionCredentials)
	doc, err := encode(u)
	if err != nil {
		return err
	}
	err = t.insert(`INSERT INTO user_tokens (hash, user_id, family, expires, doc) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		u.Hash, u.UserID, u.Family, formatTime(u.Expires), doc)
	if err != nil {
		return fmt.Errorf("insert %s token: %w", u.Kind, err)
	}
	return nil
}

// FindUserToken returns the token with the hash.
func (t *tx) FindUserToken(hash []byte) (*dbcloud.UserToken, error) {
	ts, err := t.listUserTokens(`SELECT hash, doc FROM user_tokens WHERE hash = ?`+t.forUpdate, hash)
	if err == nil && len(ts) == 0 {
		err = dbcloud.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find token: %w", err)
	}
	return ts[0], nil
}

// ListTokenFamily lists the tokens of one login, oldest first.
func (t *tx) ListTokenFamily(family string) ([]*dbcloud.UserToken, error) {
	ts, err := t.listUserTokens(`SELECT hash, doc FROM user_tokens WHERE family = ? ORDER BY expires`, family)
	if err != nil {
		return nil, fmt.Errorf("list token family: %w", err)
	}
	return ts, nil
}

// ListUserTokens lists every token of a user, oldest first.
func (t *tx) ListUserTokens(userID string) ([]*dbcloud.UserToken, error) {
	ts, err := t.listUserTokens(`SELECT hash, doc FROM user_tokens WHERE user_id = ? ORDER BY expires`, userID)
	if err != nil {
		return nil, fmt.Errorf("list tokens of %s: %w", userID, err)
	}
	return ts, nil
}

func (t *tx) listUserTokens(query string, args ...any) ([]*dbcloud.UserToken, error) {
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []*dbcloud.UserToken{}
	var doc sql.RawBytes
	for rows.Next() {
		var hash []byte
		if err := rows.Scan(&hash, &doc); err != nil {
			return nil, err
		}
		u, err := decode[dbcloud.UserToken](doc)
		if err != nil {
			return nil, err
		}
		u.Hash = hash
		out = append(out, u)
	}
	return out, rows.Err()
}

// UpdateUserToken replaces a token's doc; ErrNotFound if missing.
func (t *tx) UpdateUserToken(u *dbcloud.UserToken) error {
	t.touch(dbcloud.RevisionCredentials)
	doc, err := encode(u)
	if err != nil {
		return err
	}
	if err := t.change(`UPDATE user_tokens SET expires = ?, doc = ? WHERE hash = ?`, formatTime(u.Expires), doc, u.Hash); err != nil {
		return fmt.Errorf("update %s token: %w", u.Kind, err)
	}
	return nil
}

// DeleteUserTokensBefore deletes the tokens that expired before then.
func (t *tx) DeleteUserTokensBefore(then time.Time) (int, error) {
	res, err := t.exec(`DELETE FROM user_tokens WHERE expires < ?`, formatTime(then))
	if err != nil {
		return 0, fmt.Errorf("delete expired tokens: %w", err)
	}
	n, err := res.RowsAffected()
	if n > 0 {
		// Only when something went: the periodic purge then leaves
		// every verified credential kept.
		t.touch(dbcloud.RevisionCredentials)
	}
	return int(n), err
}
