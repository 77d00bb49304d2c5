package sqlstore

import (
	"database/sql"
	"fmt"
	"time"

	"dbcloud"
	"dbcloud/identity"
)

// Memberships have no doc: every field is a column.
var memberships = define(entity[dbcloud.Membership]{
	table: "memberships", noun: "membership", noDoc: true,
	key:  []string{"project_id", "user_id"},
	cols: []string{"role", "created"}, set: []string{"role"},
	values: func(m *dbcloud.Membership) []any {
		return []any{m.ProjectID, m.UserID, string(m.Role), formatTime(m.Created)}
	},
	read:   "project_id, user_id, role, created",
	scan:   scanMembership,
	scopes: credentials[dbcloud.Membership],
	label:  func(key ...any) string { return fmt.Sprintf("%s/%s", key...) },
})

func scanMembership(rows *sql.Rows) (*dbcloud.Membership, error) {
	var m dbcloud.Membership
	var role, created string
	err := rows.Scan(&m.ProjectID, &m.UserID, &role, &created)
	if err != nil {
		return nil, err
	}
	m.Role = identity.Role(role)
	if m.Created, err = time.Parse(timeLayout, created); err != nil {
		return nil, err
	}
	return &m, nil
}

// InsertMembership adds a membership; ErrDuplicate if the user is a member.
func (t *tx) InsertMembership(m *dbcloud.Membership) error { return memberships.insert(t, m) }

// FindMembership returns the user's membership of the project.
func (t *tx) FindMembership(projectID, userID string) (*dbcloud.Membership, error) {
	return memberships.find(t, projectID, userID)
}

// ListMembers lists a project's memberships, oldest first.
func (t *tx) ListMembers(projectID string) ([]*dbcloud.Membership, error) {
	return memberships.list(t, "members of "+projectID, `WHERE project_id = ? ORDER BY created, user_id`, projectID)
}

// ListMemberships lists a user's memberships, oldest first.
func (t *tx) ListMemberships(userID string) ([]*dbcloud.Membership, error) {
	return memberships.list(t, "memberships of "+userID, `WHERE user_id = ? ORDER BY created, project_id`, userID)
}

// UpdateMembership changes a member's role; ErrNotFound if missing.
func (t *tx) UpdateMembership(m *dbcloud.Membership) error { return memberships.update(t, m) }

// DeleteMembership removes a member; ErrNotFound if missing.
func (t *tx) DeleteMembership(projectID, userID string) error {
	return memberships.delete(t, []string{dbcloud.RevisionCredentials}, projectID, userID)
}

// User tokens keep their hash in the key column and out of the doc; errors
// do not name it.
var userTokens = define(entity[dbcloud.UserToken]{
	table: "user_tokens", noun: "token",
	key:  []string{"hash"},
	cols: []string{"user_id", "family", "expires"}, set: []string{"expires"},
	values: func(u *dbcloud.UserToken) []any {
		return []any{u.Hash, u.UserID, u.Family, formatTime(u.Expires)}
	},
	read:   "doc, hash",
	scan:   scanDocAnd(func(u *dbcloud.UserToken, hash []byte) { u.Hash = hash }),
	scopes: credentials[dbcloud.UserToken],
	label:  func(...any) string { return "" },
})

// InsertUserToken adds a token; ErrDuplicate if its hash exists.
func (t *tx) InsertUserToken(u *dbcloud.UserToken) error { return userTokens.insert(t, u) }

// FindUserToken returns the token with the hash.
func (t *tx) FindUserToken(hash []byte) (*dbcloud.UserToken, error) { return userTokens.find(t, hash) }

// ListTokenFamily lists the tokens of one login, oldest first.
func (t *tx) ListTokenFamily(family string) ([]*dbcloud.UserToken, error) {
	return userTokens.list(t, "token family", `WHERE family = ? ORDER BY expires`, family)
}

// ListUserTokens lists every token of a user, oldest first.
func (t *tx) ListUserTokens(userID string) ([]*dbcloud.UserToken, error) {
	return userTokens.list(t, "tokens of "+userID, `WHERE user_id = ? ORDER BY expires`, userID)
}

// UpdateUserToken replaces a token's doc; ErrNotFound if missing.
func (t *tx) UpdateUserToken(u *dbcloud.UserToken) error { return userTokens.update(t, u) }

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
