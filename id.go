package dbcloud

import (
	"crypto/rand"
	"crypto/sha256"
	"math/big"
	"strings"
	"unicode"
	"unicode/utf8"
)

// HashSecret hashes an API key secret for storage. Secrets are 256-bit random
// values, so a fast hash is as strong as a slow one and keeps auth cheap.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte("dbcloud-api-key:" + secret))
	return h[:]
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// NewID returns a random identifier of 10 characters from [a-z0-9], the form
// of project, service and replica set IDs.
func NewID() string { return randomString(idAlphabet, 10) }

// NewAccessKey returns a new API key's public half: "dbc" and 21
// characters of [a-z0-9].
func NewAccessKey() string { return "dbc" + randomString(idAlphabet, 21) }

// NewNumericID returns a random decimal identifier, the form of VPC and
// peering IDs. The first digit is never zero so the value reads as a number.
func NewNumericID() string {
	return randomString("123456789", 1) + randomString("0123456789", 9)
}

func randomString(alphabet string, n int) string {
	b := make([]byte, n)
	max := big.NewInt(int64(len(alphabet)))
	for i := range b {
		v, err := rand.Int(rand.Reader, max)
		if err != nil {
			panic(err) // crypto/rand does not fail on Linux
		}
		b[i] = alphabet[v.Int64()]
	}
	return string(b)
}

// IsID reports whether s has the form of a project, service or replica set ID.
func IsID(s string) bool {
	return len(s) == 10 && strings.Trim(s, idAlphabet) == ""
}

// IsNumericID reports whether s has the form of a VPC or peering ID.
func IsNumericID(s string) bool {
	return len(s) > 0 && len(s) <= 20 && strings.Trim(s, "0123456789") == ""
}

// NormalName applies the naming rule of services, VPCs, replica sets,
// projects, keys, users and credentials, for every client alike: white
// space around the name is dropped, and what is left must hold a visible
// character (a name of spaces makes an invisible link in a list).
func NormalName(field, s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", Errorf(KindInvalid, "%s must contain a visible character.", field)
	}
	return s, validateName(field, s)
}

// validateName checks a name as it is: 1 to 128 characters, none of them
// a control or formatting character. NormalName is the rule for input.
func validateName(field, s string) error {
	n := utf8.RuneCountInString(s)
	if n < 1 || n > 128 {
		return Errorf(KindInvalid, "%s must be 1 to 128 characters, got %d.", field, n)
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, invisible) >= 0 {
		return Errorf(KindInvalid, "%s must not contain control or formatting characters (such as bidirectional overrides, U+202A to U+202E and U+2066 to U+2069, or U+200E and U+200F), which make a console or log show another text than the name.", field)
	}
	return nil
}

// invisible reports control characters and Unicode format characters
// (category Cf: bidirectional embeddings, overrides, isolates and marks,
// zero-width characters), which change how the text around them is shown.
func invisible(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// CredentialUsername is the database role of the credential with this ID.
// The dbcloud_ prefix is reserved in every service (the guard refuses a
// tenant's CREATE, ALTER, GRANT and DROP of such roles), so tsdbadmin can
// neither take a credential's place nor change what it may do.
func CredentialUsername(id string) string { return "dbcloud_cred_" + id }
