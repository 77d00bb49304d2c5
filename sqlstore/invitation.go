package sqlstore

import (
	"fmt"

	"dbcloud"
)

// Invitations keep their token's hash in a column of its own (json:"-"),
// unique, so a link finds one invitation; errors name the ID, never the
// hash. They touch no revision scope: authentication never reads them,
// and accepting one writes a membership, which does.
var invitations = define(entity[dbcloud.Invitation]{
	table: "invitations", noun: "invitation",
	key:  []string{"id", "project_id"},
	cols: []string{"hash", "created"},
	values: func(i *dbcloud.Invitation) []any {
		return []any{i.ID, i.ProjectID, i.Hash, formatTime(i.Created)}
	},
	read: "doc, hash",
	scan: scanDocAnd(func(i *dbcloud.Invitation, hash []byte) { i.Hash = hash }),
})

// InsertInvitation adds an invitation; ErrDuplicate if its ID or hash exists.
func (t *tx) InsertInvitation(i *dbcloud.Invitation) error { return invitations.insert(t, i) }

// FindInvitation returns one of a project's invitations by ID.
func (t *tx) FindInvitation(projectID, id string) (*dbcloud.Invitation, error) {
	return invitations.find(t, id, projectID)
}

// FindInvitationByHash returns the invitation whose token has the hash.
func (t *tx) FindInvitationByHash(hash []byte) (*dbcloud.Invitation, error) {
	return invitations.findWhere(t, "invitation", `hash = ?`, hash)
}

// ListInvitations returns a project's invitations, oldest first.
func (t *tx) ListInvitations(projectID string) ([]*dbcloud.Invitation, error) {
	return invitations.list(t, fmt.Sprintf("invitations of project %s", projectID),
		`WHERE project_id = ? ORDER BY created, id`, projectID)
}

// UpdateInvitation replaces an invitation's doc; ErrNotFound if missing.
func (t *tx) UpdateInvitation(i *dbcloud.Invitation) error { return invitations.update(t, i) }
