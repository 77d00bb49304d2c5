package dbcloud

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"
)

const passwordAlphabet = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789"

// NewPassword returns a random initial password (about 140 bits), made of
// characters that need no quoting in a connection URI.
func NewPassword() string { return randomString(passwordAlphabet, 24) }

// ValidatePassword applies the password rule of updatePassword.
func ValidatePassword(pw string) error {
	n := utf8.RuneCountInString(pw)
	if n < 8 || n > 256 {
		return Errorf(KindInvalid, "password must be 8 to 256 characters, got %d.", n)
	}
	if !utf8.ValidString(pw) || strings.ContainsRune(pw, 0) {
		return Errorf(KindInvalid, "password must be valid UTF-8 without NUL characters.")
	}
	return nil
}

// scramIterations matches PostgreSQL's default scram_iterations.
const scramIterations = 4096

// NewSCRAMVerifier computes the SCRAM-SHA-256 verifier PostgreSQL stores for
// a password (RFC 5802, RFC 7677). dbcloud keeps only this verifier and sends
// it in ALTER ROLE, so the plaintext never reaches a store, a log or a shell.
func NewSCRAMVerifier(password string) string {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		panic(err)
	}
	return scramVerifier(password, salt, scramIterations)
}

func scramVerifier(password string, salt []byte, iterations int) string {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		panic(err) // only for invalid parameters, which are constants here
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(storedKey[:]), b64(serverKey))
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}
