package local

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSwapAside: at a BLUE_GREEN switch the old version's snapshots move
// aside (forks would start them on the new version's binaries), and at a
// ROLLBACK they come back while the new version's move aside.
func TestSwapAside(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snapshots")
	write := func(path, text string) {
		if err := os.MkdirAll(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path, "which"), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join(path, "which"))
		if err != nil {
			return ""
		}
		return string(b)
	}
	write(dir, "15")
	// The switch: 15's aside, none of 17's yet.
	if err := swapAside(dir, 15, 17); err != nil {
		t.Fatal(err)
	}
	if got, aside := read(dir), read(dir+"-pg15"); got != "" || aside != "15" {
		t.Fatalf("after the switch: snapshots %q, aside %q; want none and 15's", got, aside)
	}
	write(dir, "17") // taken on 17 after the switch
	// The rollback: 17's aside, 15's back.
	if err := swapAside(dir, 17, 15); err != nil {
		t.Fatal(err)
	}
	if got, aside := read(dir), read(dir+"-pg17"); got != "15" || aside != "17" {
		t.Fatalf("after the rollback: snapshots %q, aside %q; want 15's and 17's", got, aside)
	}
}
