package dbcloud

import "time"

// CredentialAccess is what a database credential may do.
type CredentialAccess string

// Credential access levels (decisions.md section 12).
const (
	// CredentialReadOnly sessions are read-only whatever they set.
	CredentialReadOnly CredentialAccess = "READ_ONLY"
	// CredentialReadWrite sessions act with tsdbadmin's privileges.
	CredentialReadWrite CredentialAccess = "READ_WRITE"
)

// Bounds of a credential's time to live.
const (
	MinCredentialTTL     = time.Minute
	MaxCredentialTTL     = 30 * 24 * time.Hour
	DefaultCredentialTTL = time.Hour
)

// Credential is a database login of its own on one service, minted for a
// person or an agent, that expires by itself (decisions.md section 12).
// Its password is shown once, when it is made; only the SCRAM verifier is
// kept. A revoked or expired credential stays stored until the runtime has
// dropped its role, so a role is never left behind by a crash.
type Credential struct {
	ID        string           `json:"id"`
	ProjectID string           `json:"project_id"`
	ServiceID string           `json:"service_id"`
	Name      string           `json:"name"`
	Access    CredentialAccess `json:"access"`
	// Verifier is the SCRAM-SHA-256 verifier of the password.
	Verifier string    `json:"verifier"`
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires"`
	// CreatedBy is who made it.
	CreatedBy Requester `json:"created_by"`
	// Revoked is when it was revoked; nil while it is not.
	Revoked *time.Time `json:"revoked,omitempty"`
}

// Username is the credential's database role.
func (c *Credential) Username() string { return CredentialUsername(c.ID) }

// Live reports whether the credential may log in at now.
func (c *Credential) Live(now time.Time) bool { return c.Revoked == nil && now.Before(c.Expires) }

// Role is the credential as the runtime makes it.
func (c *Credential) Role() CredentialRole {
	return CredentialRole{Username: c.Username(), Verifier: c.Verifier, ReadOnly: c.Access == CredentialReadOnly, Expires: c.Expires}
}

// LiveRoles is the roles of the credentials live at now: what a service's
// credential roles must be.
func LiveRoles(creds []*Credential, now time.Time) []CredentialRole {
	out := []CredentialRole{}
	for _, c := range creds {
		if c.Live(now) {
			out = append(out, c.Role())
		}
	}
	return out
}

// ParseCredentialAccess reads the access of a create request.
func ParseCredentialAccess(s string) (CredentialAccess, error) {
	switch a := CredentialAccess(s); a {
	case CredentialReadOnly, CredentialReadWrite:
		return a, nil
	}
	return "", Errorf(KindInvalid, "access must be READ_ONLY or READ_WRITE, got %q.", s)
}

// CredentialTTL reads ttl_seconds: 0 is the default, else between the
// bounds.
func CredentialTTL(seconds int64) (time.Duration, error) {
	if seconds == 0 {
		return DefaultCredentialTTL, nil
	}
	ttl := time.Duration(seconds) * time.Second
	if seconds < 0 || ttl < MinCredentialTTL || ttl > MaxCredentialTTL {
		return 0, Errorf(KindInvalid, "ttl_seconds must be between %d and %d, got %d.",
			int64(MinCredentialTTL/time.Second), int64(MaxCredentialTTL/time.Second), seconds)
	}
	return ttl, nil
}
