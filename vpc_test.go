package dbcloud_test

import (
	"net/netip"
	"testing"

	"dbcloud"
)

func TestParseCIDR(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"10.0.0.0/16", true},
		{"10.255.255.240/28", true},
		{"172.16.0.0/16", true},
		{"172.31.255.0/24", true},
		{"192.168.0.0/16", true},
		{"10.0.0.0/15", false},   // too wide
		{"10.0.0.0/29", false},   // too narrow
		{"10.0.0.1/16", false},   // host bits set
		{"172.32.0.0/16", false}, // outside 172.16.0.0/12
		{"8.8.8.0/24", false},
		{"100.64.0.0/16", false},
		{"fd00::/16", false},
		{"::ffff:10.0.0.0/112", false},
		{"10.0.0.0", false},
		{"", false},
		{"10.0.0.0/16 ", false},
	} {
		p, err := dbcloud.ParseCIDR(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseCIDR(%q) = %v, %v; want ok=%v", tc.in, p, err, tc.ok)
		}
		if err != nil && dbcloud.ErrorKindOf(err) != dbcloud.KindInvalid {
			t.Errorf("ParseCIDR(%q): kind %v, want invalid", tc.in, dbcloud.ErrorKindOf(err))
		}
	}
}

// FuzzParseCIDR checks that whatever ParseCIDR accepts obeys every rule of
// decisions.md section 9, and that it never panics.
func FuzzParseCIDR(f *testing.F) {
	for _, s := range []string{"10.0.0.0/16", "192.168.1.0/24", "172.16.0.0/12", "10.0.0.1/16", "::/0", "1.2.3.4/33", "10.0.0.0/016"} {
		f.Add(s)
	}
	private := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16")}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := dbcloud.ParseCIDR(s)
		if err != nil {
			if dbcloud.ErrorKindOf(err) != dbcloud.KindInvalid {
				t.Fatalf("ParseCIDR(%q): error kind %v", s, dbcloud.ErrorKindOf(err))
			}
			return
		}
		if !p.Addr().Is4() || p.Masked() != p || p.Bits() < 16 || p.Bits() > 28 {
			t.Fatalf("ParseCIDR(%q) accepted %v", s, p)
		}
		inside := false
		for _, b := range private {
			inside = inside || (b.Contains(p.Addr()) && b.Bits() <= p.Bits())
		}
		if !inside {
			t.Fatalf("ParseCIDR(%q) accepted %v outside the private ranges", s, p)
		}
	})
}
