package dbcloud

import "testing"

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"db", "prod-eu 1", "données", "数据库", "emoji 🐘"} {
		if err := ValidateName("name", ok); err != nil {
			t.Errorf("validateName(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{
		"", "tab\there", "nl\n", "del\x7f", "\x00",
		"evil\u202egpj.exe", // right-to-left override
		"a\u202ab", "a\u202bb", "a\u202cb", "a\u202db",
		"a\u2066b", "a\u2067b", "a\u2068b", "a\u2069b", // isolates
		"a\u200eb", "a\u200fb", // directional marks
		"a\u200bb", "a\ufeffb", "a\u2028b", "a\u2029b", // zero width, BOM, separators
		"bad\xffutf8",
	} {
		err := ValidateName("name", bad)
		if ErrorKindOf(err) != KindInvalid {
			t.Errorf("validateName(%q) = %v, want an invalid-request error", bad, err)
		}
	}
}
