package dbcloud

import (
	"strings"
	"testing"
)

func TestNormalName(t *testing.T) {
	for in, want := range map[string]string{
		"db": "db", "prod-eu 1": "prod-eu 1", "données": "données", "数据库": "数据库", "emoji 🐘": "emoji 🐘",
		// White space around a name is dropped, inside it kept.
		"  shop  ": "shop", "\u00a0shop\u3000": "shop", " a  b ": "a  b",
	} {
		if got, err := NormalName("name", in); err != nil || got != want {
			t.Errorf("NormalName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"", "   ", "\u00a0\u3000", "\t \n",
		"tab\there", "nl\nx", "del\x7f", "\x00",
		"evil\u202egpj.exe", // right-to-left override
		"a\u202ab", "a\u202bb", "a\u202cb", "a\u202db",
		"a\u2066b", "a\u2067b", "a\u2068b", "a\u2069b", // isolates
		"a\u200eb", "a\u200fb", // directional marks
		"a\u200bb", "a\ufeffb", "a\u2028b", "a\u2029b", // zero width, BOM, separators
		"bad\xffutf8", strings.Repeat("x", 129),
	} {
		_, err := NormalName("name", bad)
		if ErrorKindOf(err) != KindInvalid {
			t.Errorf("NormalName(%q) = %v, want an invalid-request error", bad, err)
		}
	}
	if _, err := NormalName("name", "  "); err == nil || !strings.Contains(err.Error(), "visible character") {
		t.Errorf("a name of spaces: %v, want it refused for having no visible character", err)
	}
}
