package dbcloud

import (
	"crypto/rand"
	"encoding/base64"
	"time"

	"dbcloud/identity"
)

// Membership gives a user a role in a project.
type Membership struct {
	ProjectID string        `json:"project_id"`
	UserID    string        `json:"user_id"`
	Role      identity.Role `json:"role"`
	Created   time.Time     `json:"created"`
}

// Token kinds.
const (
	TokenCode    = "code"    // an OAuth authorization code
	TokenAccess  = "access"  // an OAuth access token (Bearer on the API)
	TokenRefresh = "refresh" // an OAuth refresh token
	TokenSession = "session" // a console session (cookie)
)

// UserToken is a secret handed to a user's client. Only its hash is kept.
type UserToken struct {
	Hash   []byte `json:"-"`
	Kind   string `json:"kind"`
	UserID string `json:"user_id"`
	// Family groups the tokens of one login (a code, and the access and
	// refresh tokens that descend from it; or one console session), so
	// that signing out, or a refresh token used twice, ends all of them.
	Family   string     `json:"family"`
	ClientID string     `json:"client_id,omitempty"`
	Created  time.Time  `json:"created"`
	Expires  time.Time  `json:"expires"`
	Revoked  *time.Time `json:"revoked,omitempty"`
	// Used marks a code exchanged or a refresh token rotated: each is
	// good for one use.
	Used *time.Time `json:"used,omitempty"`
	// A code is bound to the redirect URI and the PKCE challenge
	// (S256 of the verifier, base64url) it was issued for.
	RedirectURI string `json:"redirect_uri,omitempty"`
	Challenge   string `json:"challenge,omitempty"`
	// CSRF is a console session's anti-forgery token; it is sent in every
	// form, so it is no more secret than the page itself.
	CSRF string `json:"csrf,omitempty"`
}

// Live reports whether the token may still be used at now.
func (t *UserToken) Live(now time.Time) bool {
	return t.Revoked == nil && t.Used == nil && now.Before(t.Expires)
}

// HashToken hashes a user token for storage and lookup. Tokens are 256-bit
// random values, so, as for API key secrets, a fast hash is enough.
func HashToken(token string) []byte { return HashSecret("user-token:" + token) }

// NewTokenSecret returns a fresh random token with a prefix naming its kind
// (so a leaked one is recognisable) and no colon, so that a Bearer token is
// never mistaken for an ACCESS:SECRET key pair.
func NewTokenSecret(kind string) string {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return "dbc_" + kind + "_" + base64.RawURLEncoding.EncodeToString(raw)
}

// InvitationTTL is how long an invitation link works: long enough for a
// weekend, short enough that a link lost in a mailbox dies.
const InvitationTTL = 7 * 24 * time.Hour

// Invitation asks a person, named by e-mail address, to join a project
// with a role. The inviter copies a one-time link; only the hash of its
// token is kept, so the store never holds a link that works.
type Invitation struct {
	ID        string        `json:"id"`
	ProjectID string        `json:"project_id"`
	Email     string        `json:"email"`
	Role      identity.Role `json:"role"`
	// InvitedBy is the inviting user's ID.
	InvitedBy string    `json:"invited_by"`
	Hash      []byte    `json:"-"`
	Created   time.Time `json:"created"`
	Expires   time.Time `json:"expires"`
	// Accepted is set when the link was used, by AcceptedBy; Revoked
	// when an owner or admin withdrew it. Either ends it.
	Accepted   *time.Time `json:"accepted,omitempty"`
	AcceptedBy string     `json:"accepted_by,omitempty"`
	Revoked    *time.Time `json:"revoked,omitempty"`
}

// Pending reports whether the invitation's link still works at now.
func (i *Invitation) Pending(now time.Time) bool {
	return i.Accepted == nil && i.Revoked == nil && now.Before(i.Expires)
}
