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
