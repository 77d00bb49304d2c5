package dbcloud

import (
	"encoding/base64"
	"regexp"
	"testing"
)

func TestNewSCRAMVerifier(t *testing.T) {
	v := NewSCRAMVerifier("pencil")
	if !regexp.MustCompile(`^SCRAM-SHA-256\$4096:[A-Za-z0-9+/=]{24}\$[A-Za-z0-9+/=]{44}:[A-Za-z0-9+/=]{44}$`).MatchString(v) {
		t.Fatalf("verifier %q is not in PostgreSQL's form", v)
	}
	if NewSCRAMVerifier("pencil") == v {
		t.Error("two verifiers of one password share a salt")
	}
	// RFC 7677's example: user "user", password "pencil", this salt; its
	// ServerKey is fixed by the RFC's derivation.
	salt, _ := base64.StdEncoding.DecodeString("W22ZaJ0SNY7soEsUEjb6gQ==")
	got := scramVerifier("pencil", salt, 4096)
	want := "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
	if got != want {
		t.Errorf("verifier = %s\nwant       %s", got, want)
	}
}

func TestValidatePassword(t *testing.T) {
	for pw, ok := range map[string]bool{"12345678": true, "short": false, "with\x00nul!": false, string(make([]byte, 257)): false} {
		if err := ValidatePassword(pw); (err == nil) != ok {
			t.Errorf("ValidatePassword(%q) = %v, want ok=%v", pw, err, ok)
		}
	}
}
