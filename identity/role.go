// Package identity holds what a person or key may do in a project (roles
// and the actions they allow) and how a user's password is kept. It knows
// nothing of stores or HTTP, so the domain, the console and the command
// line all judge with the one table below.
package identity

import (
	"fmt"
	"slices"
)

// Role is a member's (or an API key's) standing in one project.
type Role string

const (
	Viewer    Role = "viewer"
	Developer Role = "developer"
	Admin     Role = "admin"
	Owner     Role = "owner"
)

// Roles lists the roles from least to most allowed.
var Roles = []Role{Viewer, Developer, Admin, Owner}

// Action is one kind of thing a caller asks to do in a project. Every
// operation of the API and console names exactly one (docs/roles.md).
type Action string

const (
	// Read is looking at anything of the project: services, logs, VPCs,
	// replica sets, members and the list of keys (never a secret).
	Read Action = "read"
	// MintReadOnly is making and revoking READ_ONLY database credentials
	// of a service (decisions.md section 12): what a viewer may hand to a
	// dashboard or an agent, since it reads no more than the viewer could.
	MintReadOnly Action = "mint-read-only-credentials"
	// ChangeResources is creating, changing, forking, stopping, starting
	// and deleting services, replica sets, VPCs and peerings, and making
	// READ_WRITE database credentials.
	ChangeResources Action = "change-resources"
	// ManageKeys is creating and revoking the project's API keys.
	ManageKeys Action = "manage-keys"
	// ManageMembers is adding and removing members and changing roles.
	ManageMembers Action = "manage-members"
	// DeleteProject is deleting the project itself.
	DeleteProject Action = "delete-project"
)

// Actions lists every action, in the order of docs/roles.md.
var Actions = []Action{Read, MintReadOnly, ChangeResources, ManageKeys, ManageMembers, DeleteProject}

// allowed is the role table. Each role allows what the one below it does
// and more; it is spelled out rather than derived from the rank so that a
// reader (and docs/roles.md) can check it line by line.
var allowed = map[Role][]Action{
	Viewer:    {Read, MintReadOnly},
	Developer: {Read, MintReadOnly, ChangeResources},
	Admin:     {Read, MintReadOnly, ChangeResources, ManageKeys, ManageMembers},
	Owner:     {Read, MintReadOnly, ChangeResources, ManageKeys, ManageMembers, DeleteProject},
}

// Allows reports whether the role may take the action. An unknown role
// allows nothing.
func (r Role) Allows(a Action) bool { return slices.Contains(allowed[r], a) }

// Rank orders roles: a higher rank allows everything a lower one does.
// Unknown roles rank below every known one.
func (r Role) Rank() int { return slices.Index(Roles, r) }

// Valid reports whether r is one of the four roles.
func (r Role) Valid() bool { return r.Rank() >= 0 }

// ParseRole reads a role name as the API and the command line take it.
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if !r.Valid() {
		return "", fmt.Errorf("role must be one of viewer, developer, admin, owner; got %q", s)
	}
	return r, nil
}

// MayGrant reports whether a member of role r may give (or take away)
// role target: admins manage everyone below owner, owners everyone. Nobody
// else manages members at all.
func (r Role) MayGrant(target Role) bool {
	if !r.Allows(ManageMembers) || !target.Valid() {
		return false
	}
	return r == Owner || target.Rank() < Owner.Rank()
}
