package dbcloud

import "time"

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

// User is a person who issues API keys.
type User struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Email   string    `json:"email"`
	Created time.Time `json:"created"`
}

// APIKey is a project-scoped credential. Only a hash of its secret is kept.
type APIKey struct {
	AccessKey  string     `json:"access_key"`
	ProjectID  string     `json:"project_id"`
	UserID     string     `json:"user_id"`
	Name       string     `json:"name"`
	SecretHash []byte     `json:"-"`
	Created    time.Time  `json:"created"`
	Revoked    *time.Time `json:"revoked,omitempty"`
}

// Principal is the authenticated caller of a request.
type Principal struct {
	Key     *APIKey
	Project *Project
	User    *User
}

// CanAccess reports whether the principal may see the project. A key sees
// only its own project; anything else answers 404 so existence is not leaked.
func (p *Principal) CanAccess(projectID string) bool {
	return p != nil && p.Project != nil && p.Project.ID == projectID
}
