package identity

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/crypto/argon2"
)

// PasswordParams are the Argon2id costs. The defaults are RFC 9106's
// second recommended option (64 MiB, 3 passes), with one lane because the
// control plane's host is small and a sign-in is rare.
type PasswordParams struct {
	Time    uint32
	Memory  uint32 // KiB
	Threads uint8
}

// DefaultPasswordParams are the costs new hashes get.
var DefaultPasswordParams = PasswordParams{Time: 3, Memory: 64 * 1024, Threads: 1}

// MinPasswordLength is the shortest password a user may choose (NIST
// SP 800-63B's floor); the longest is bounded so hashing stays bounded.
const (
	MinPasswordLength = 12
	MaxPasswordLength = 256
)

// CheckPassword says what is wrong with a password a user chose, or nil.
func CheckPassword(pw string) error {
	n := utf8.RuneCountInString(pw)
	if n < MinPasswordLength || len(pw) > MaxPasswordLength {
		return fmt.Errorf("a password must be %d to %d characters long, got %d", MinPasswordLength, MaxPasswordLength, n)
	}
	return nil
}

// HashPassword returns the PHC string of an Argon2id hash of pw with a
// fresh salt: $argon2id$v=19$m=65536,t=3,p=1$salt$hash.
func HashPassword(pw string, p PasswordParams) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	sum := argon2.IDKey([]byte(pw), salt, p.Time, p.Memory, p.Threads, 32)
	enc := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, p.Memory, p.Time, p.Threads,
		enc.EncodeToString(salt), enc.EncodeToString(sum)), nil
}

var errHashFormat = errors.New("not an argon2id hash")

// VerifyPassword reports whether pw matches the PHC string, in constant
// time. The costs are read from the string, so raising the defaults keeps
// old hashes working.
func VerifyPassword(pw, phc string) (bool, error) {
	parts := strings.Split(phc, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false, errHashFormat
	}
	var v int
	var p PasswordParams
	if _, err := fmt.Sscanf(parts[2], "v=%d", &v); err != nil || v != argon2.Version {
		return false, errHashFormat
	}
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &p.Memory, &p.Time, &p.Threads); err != nil {
		return false, errHashFormat
	}
	enc := base64.RawStdEncoding
	salt, err1 := enc.DecodeString(parts[4])
	want, err2 := enc.DecodeString(parts[5])
	if err1 != nil || err2 != nil || len(want) == 0 || p.Time == 0 || p.Threads == 0 {
		return false, errHashFormat
	}
	got := argon2.IDKey([]byte(pw), salt, p.Time, p.Memory, p.Threads, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}

// NewPassword returns a random password for a user made by the operator
// (the bootstrap owner), shown once: 24 characters of base64url, 144 bits.
func NewPassword() string {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
