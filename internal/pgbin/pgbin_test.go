package pgbin

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestInstalled finds each major version's binaries in Debian's layout and
// leaves out a directory that is not a version or has no server.
func TestInstalled(t *testing.T) {
	root := t.TempDir()
	for _, dir := range []string{"15/bin", "17/bin", "16/bin", "common/bin"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"15/bin/initdb", "15/bin/postgres", "17/bin/initdb", "17/bin/postgres",
		"16/bin/psql", "common/bin/initdb", "common/bin/postgres"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want := map[int]string{15: filepath.Join(root, "15/bin"), 17: filepath.Join(root, "17/bin")}
	if got := Installed(root); !reflect.DeepEqual(got, want) {
		t.Errorf("Installed = %v, want %v", got, want)
	}
}

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		out   string
		major int
		full  string
	}{
		{"postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)\n", 15, "15.20"},
		{"postgres (PostgreSQL) 17.12 (Debian 17.12-0+deb13u1)\n", 17, "17.12"},
		{"postgres (PostgreSQL) 18beta1\n", 0, ""},
		{"psql (PostgreSQL) 17.12\n", 0, ""},
	} {
		major, full, err := parseVersion(tc.out)
		if tc.major == 0 {
			if err == nil {
				t.Errorf("parseVersion(%q) = %d %q, want an error", tc.out, major, full)
			}
			continue
		}
		if err != nil || major != tc.major || full != tc.full {
			t.Errorf("parseVersion(%q) = %d %q %v, want %d %q", tc.out, major, full, err, tc.major, tc.full)
		}
	}
	if major, full, err := Version(Dir()); err != nil || major < 10 || full == "" {
		t.Errorf("Version(%s) = %d %q %v", Dir(), major, full, err)
	}
}
