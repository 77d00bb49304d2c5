package dbcloud

import (
	"maps"
	"time"

	"dbcloud/identity"
)

// Project groups services and VPCs; every API key belongs to one.
type Project struct {
	ID       string    `json:"id"`
	Name     string    `json:"name"`
	PlanType string    `json:"plan_type"`
	Created  time.Time `json:"created"`
	// Quota is the project's own resource quota; nil means the server's
	// default (Config.Quotas.Resources).
	Quota *ResourceQuota `json:"resource_quota,omitempty"`
}

// User is a person: a member of projects, who signs in to the console and
// the command-line clients and issues API keys.
type User struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Email   string    `json:"email"`
	Created time.Time `json:"created"`
	// Disabled users can neither sign in nor use their tokens or keys.
	Disabled *time.Time `json:"disabled,omitempty"`
	// PasswordHash is the Argon2id PHC string; empty means no password
	// (the user cannot sign in). Kept in a column of its own, like an API
	// key's SecretHash, so no encoder of the struct can leak it.
	PasswordHash string `json:"-"`
}

// APIKey is a project-scoped credential. Only a hash of its secret is kept.
type APIKey struct {
	AccessKey string `json:"access_key"`
	ProjectID string `json:"project_id"`
	UserID    string `json:"user_id"`
	Name      string `json:"name"`
	// Role bounds what the key may do in its project; it is also capped
	// by the issuing user's own role there (see Authenticate).
	Role       identity.Role `json:"role"`
	SecretHash []byte        `json:"-"`
	Created    time.Time     `json:"created"`
	Revoked    *time.Time    `json:"revoked,omitempty"`
	// LastUsed is when the key last authenticated a request, to within
	// a minute (Cloud records it at most once a minute per key). Kept in
	// a column of its own, written without touching the credentials'
	// revision, so recording it never drops verified credentials.
	LastUsed *time.Time `json:"-"`
}

// Principal is the authenticated caller of a request: an API key (Key,
// its Project and issuing User set) or a signed-in user (User and Token
// set, Key nil).
type Principal struct {
	Key     *APIKey
	Project *Project
	User    *User
	// Token is the user's OAuth access token or console session.
	Token *UserToken
	// Roles maps each project the caller may see to its role there. For a
	// key it holds the key's project only.
	Roles map[string]identity.Role
}

// RoleIn returns the caller's role in the project, and false when the
// caller may not see it at all.
func (p *Principal) RoleIn(projectID string) (identity.Role, bool) {
	if p == nil {
		return "", false
	}
	r, ok := p.Roles[projectID]
	return r, ok
}

// CanAccess reports whether the principal may see the project. A key sees
// only its own project; anything else answers 404 so existence is not leaked.
func (p *Principal) CanAccess(projectID string) bool {
	_, ok := p.RoleIn(projectID)
	return ok
}

// ID names the credential for rate limits, idempotency records and logs:
// the access key, or the user's token family (one login, across rotations).
func (p *Principal) ID() string {
	if p.Key != nil {
		return p.Key.AccessKey
	}
	return "user:" + p.User.ID + ":" + p.Token.Family
}

// Clone copies the principal and what it points to, so a caller that
// changes its principal cannot change what the next request gets.
func (p *Principal) Clone() *Principal {
	cp := *p
	if p.Key != nil {
		k := *p.Key
		cp.Key = &k
	}
	if p.Project != nil {
		pr := *p.Project
		cp.Project = &pr
	}
	if p.User != nil {
		u := *p.User
		cp.User = &u
	}
	if p.Token != nil {
		t := *p.Token
		cp.Token = &t
	}
	cp.Roles = maps.Clone(p.Roles)
	return &cp
}
