// Package oauth is dbcloud's OAuth 2 authorization server for command-line
// clients: the authorization-code grant (RFC 6749) with PKCE, S256 only
// (RFC 7636), for public clients that receive the code on a loopback
// redirect URI on any port (RFC 8252), and rotating refresh tokens.
//
// It decides; the console package shows the sign-in and approval pages and
// serves the token endpoint over HTTP. Codes and tokens are kept as hashes
// in the store (dbcloud.UserToken), so a copy of the store lets nobody in.
package oauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/url"
	"strings"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

// TigerCLIClientID is the client id the original's command-line client
// (tiger) sends; dbcloud knows it as a public client, so `tiger auth login`
// works against dbcloud as it does against the original.
const TigerCLIClientID = "45e1b16d-e435-4049-97b2-8daad150818c"

// Client is a registered public client. Public clients have no secret:
// PKCE binds the code to the client instance that asked for it.
type Client struct {
	ID   string
	Name string // shown to the user on the approval page
}

// Lifetimes of what the server issues.
const (
	// CodeTTL is under a minute: the client redeems the code at once.
	CodeTTL = 50 * time.Second
	// AccessTTL keeps a leaked access token short-lived; the client
	// refreshes quietly.
	AccessTTL = 15 * time.Minute
	// RefreshTTL bounds a login that is never used.
	RefreshTTL = 30 * 24 * time.Hour
)

// Server is the authorization server.
type Server struct {
	Cloud   *cloud.Cloud
	Clients map[string]Client
}

// New returns a server that knows the original's CLI and dbcloud's own.
func New(c *cloud.Cloud) *Server {
	return &Server{Cloud: c, Clients: map[string]Client{
		TigerCLIClientID: {ID: TigerCLIClientID, Name: "Tiger CLI (tiger auth login)"},
		"dbcloud-cli":    {ID: "dbcloud-cli", Name: "dbcloud command-line client"},
	}}
}

// Error is an OAuth error (RFC 6749 sections 4.1.2.1 and 5.2): Code is the
// registered error code, Description says what to do.
type Error struct {
	Code        string
	Description string
	// Redirect says whether the error may be sent to the client's redirect
	// URI; it may not while that URI is unchecked (section 4.1.2.1).
	Redirect bool
}

func (e *Error) Error() string { return e.Code + ": " + e.Description }

func fail(code, desc string) *Error { return &Error{Code: code, Description: desc} }

// Request is a checked authorization request.
type Request struct {
	Client      Client
	RedirectURI string
	State       string
	Challenge   string
}

// CheckAuthorization checks an authorization request's parameters. Until
// the client and redirect URI are known good, errors are for the user's
// eyes only; after, they go back to the client.
func (s *Server) CheckAuthorization(q url.Values) (*Request, error) {
	c, ok := s.Clients[q.Get("client_id")]
	if !ok {
		return nil, fail("invalid_request", "Unknown client_id "+quote(q.Get("client_id"))+".")
	}
	redirect := q.Get("redirect_uri")
	if !loopback(redirect) {
		return nil, fail("invalid_request", "redirect_uri must be a loopback address such as http://localhost:PORT/callback or http://127.0.0.1:PORT/callback.")
	}
	r := &Request{Client: c, RedirectURI: redirect, State: q.Get("state"), Challenge: q.Get("code_challenge")}
	toClient := func(code, desc string) error { return &Error{Code: code, Description: desc, Redirect: true} }
	if q.Get("response_type") != "code" {
		return r, toClient("unsupported_response_type", "Only response_type=code is supported.")
	}
	if q.Get("code_challenge_method") != "S256" {
		return r, toClient("invalid_request", "PKCE is required with code_challenge_method=S256.")
	}
	if raw, err := base64.RawURLEncoding.DecodeString(r.Challenge); err != nil || len(raw) != sha256.Size {
		return r, toClient("invalid_request", "code_challenge must be the base64url SHA-256 of the code verifier.")
	}
	return r, nil
}

// loopback reports whether uri is an http URI on the loopback interface,
// any port (RFC 8252 section 7.3), with no fragment or user info.
func loopback(uri string) bool {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "http" || u.User != nil || u.Fragment != "" || u.Port() == "" {
		return false
	}
	switch u.Hostname() {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	return false
}

// RedirectError returns where to send the browser for an error that may go
// to the client.
func RedirectError(r *Request, e *Error) string {
	v := url.Values{"error": {e.Code}, "error_description": {e.Description}}
	if r.State != "" {
		v.Set("state", r.State)
	}
	return withQuery(r.RedirectURI, v)
}

// Approve issues a code for the signed-in user who approved the request and
// returns where to send the browser.
func (s *Server) Approve(ctx context.Context, userID string, r *Request) (string, error) {
	var code string
	err := s.Cloud.Store.Update(ctx, func(tx dbcloud.Tx) (err error) {
		code, err = s.Cloud.IssueUserToken(tx, &dbcloud.UserToken{
			Kind: dbcloud.TokenCode, UserID: userID, ClientID: r.Client.ID,
			RedirectURI: r.RedirectURI, Challenge: r.Challenge,
		}, CodeTTL)
		return err
	})
	if err != nil {
		return "", err
	}
	v := url.Values{"code": {code}}
	if r.State != "" {
		v.Set("state", r.State)
	}
	return withQuery(r.RedirectURI, v), nil
}

// Deny returns where to send the browser when the user refuses.
func Deny(r *Request) string {
	return RedirectError(r, &Error{Code: "access_denied", Description: "The user did not approve the request."})
}

func withQuery(uri string, v url.Values) string {
	sep := "?"
	if strings.Contains(uri, "?") {
		sep = "&"
	}
	return uri + sep + v.Encode()
}

// Tokens is the token endpoint's answer (RFC 6749 section 5.1).
type Tokens struct {
	AccessToken  string `json:"access_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int    `json:"expires_in"`
	RefreshToken string `json:"refresh_token"`
}

// Token answers the token endpoint's form: the authorization_code grant,
// or the refresh_token grant.
func (s *Server) Token(ctx context.Context, form url.Values) (*Tokens, error) {
	c, ok := s.Clients[form.Get("client_id")]
	if !ok {
		return nil, fail("invalid_client", "Unknown client_id "+quote(form.Get("client_id"))+".")
	}
	switch form.Get("grant_type") {
	case "authorization_code":
		return s.exchange(ctx, c, form)
	case "refresh_token":
		return s.refresh(ctx, c, form.Get("refresh_token"))
	}
	return nil, fail("unsupported_grant_type", "grant_type must be authorization_code or refresh_token.")
}

var invalidCode = fail("invalid_grant", "The authorization code is invalid, expired, already used, or was issued for another client, redirect_uri or code_verifier; sign in again.")

func (s *Server) exchange(ctx context.Context, c Client, form url.Values) (*Tokens, error) {
	code, verifier := form.Get("code"), form.Get("code_verifier")
	if code == "" || verifier == "" {
		return nil, fail("invalid_request", "code and code_verifier are required.")
	}
	return s.redeem(ctx, code, invalidCode, func(tx dbcloud.Tx, t *dbcloud.UserToken) (bool, error) {
		if t.Kind != dbcloud.TokenCode {
			return false, nil
		}
		if t.Used != nil {
			// A code used twice was stolen or replayed: end what the first
			// use gave (RFC 6749 section 4.1.2).
			return false, s.Cloud.RevokeFamily(tx, t.Family)
		}
		return t.Live(s.Cloud.Now()) && t.ClientID == c.ID && t.RedirectURI == form.Get("redirect_uri") && pkceMatches(verifier, t.Challenge), nil
	})
}

// redeem spends a one-time token (an authorization code or a refresh
// token) for a new pair of the same login, in one transaction. spendable
// says whether t may be spent, revoking in tx what a replay exposed; a
// refusal answers refusal, whatever the reason, so a caller learns
// nothing about which check failed.
func (s *Server) redeem(ctx context.Context, secret string, refusal *Error, spendable func(dbcloud.Tx, *dbcloud.UserToken) (bool, error)) (*Tokens, error) {
	var out *Tokens
	refused := false
	err := s.Cloud.Store.Update(ctx, func(tx dbcloud.Tx) error {
		t, err := tx.FindUserToken(dbcloud.HashToken(secret))
		if dbcloud.IsNotFound(err) {
			refused = true
			return nil
		} else if err != nil {
			return err
		}
		ok, err := spendable(tx, t)
		if err != nil || !ok {
			// A revocation is committed with the refusal.
			refused = !ok
			return err
		}
		now := s.Cloud.Now().UTC()
		t.Used = &now
		if err := tx.UpdateUserToken(t); err != nil {
			return err
		}
		out, err = s.issue(tx, t.UserID, t.ClientID, t.Family)
		return err
	})
	if err != nil {
		return nil, err
	}
	if refused {
		return nil, refusal
	}
	return out, nil
}

// pkceMatches checks verifier against an S256 challenge (RFC 7636 4.6).
func pkceMatches(verifier, challenge string) bool {
	if len(verifier) < 43 || len(verifier) > 128 {
		return false
	}
	sum := sha256.Sum256([]byte(verifier))
	got := base64.RawURLEncoding.EncodeToString(sum[:])
	return subtle.ConstantTimeCompare([]byte(got), []byte(challenge)) == 1
}

var invalidRefresh = fail("invalid_grant", "The refresh token is invalid, expired or revoked; sign in again.")

func (s *Server) refresh(ctx context.Context, c Client, token string) (*Tokens, error) {
	if token == "" {
		return nil, fail("invalid_request", "refresh_token is required.")
	}
	return s.redeem(ctx, token, invalidRefresh, func(tx dbcloud.Tx, t *dbcloud.UserToken) (bool, error) {
		if t.Kind != dbcloud.TokenRefresh || t.ClientID != c.ID {
			return false, nil
		}
		if t.Used != nil && t.Revoked == nil {
			// A rotated refresh token came back: someone kept a copy.
			// End the whole login, the thief's and the owner's.
			return false, s.Cloud.RevokeFamily(tx, t.Family)
		}
		if !t.Live(s.Cloud.Now()) {
			return false, nil
		}
		u, err := tx.FindUser(t.UserID)
		if err != nil {
			return false, err
		}
		return u.Disabled == nil, nil
	})
}

// issue makes an access and a refresh token of the login.
func (s *Server) issue(tx dbcloud.Tx, userID, clientID, family string) (*Tokens, error) {
	access, err := s.Cloud.IssueUserToken(tx, &dbcloud.UserToken{Kind: dbcloud.TokenAccess, UserID: userID, ClientID: clientID, Family: family}, AccessTTL)
	if err != nil {
		return nil, err
	}
	refresh, err := s.Cloud.IssueUserToken(tx, &dbcloud.UserToken{Kind: dbcloud.TokenRefresh, UserID: userID, ClientID: clientID, Family: family}, RefreshTTL)
	if err != nil {
		return nil, err
	}
	return &Tokens{AccessToken: access, TokenType: "Bearer", ExpiresIn: int(AccessTTL / time.Second), RefreshToken: refresh}, nil
}

func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return `"` + strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s) + `"`
}
