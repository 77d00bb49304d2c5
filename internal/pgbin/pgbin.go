// Package pgbin finds the PostgreSQL server binaries.
package pgbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

const defaultBinDir = "/usr/lib/postgresql/15/bin"

// Dir finds the PostgreSQL server binaries: $DBCLOUD_PG_BIN_DIR
// (the --pg-bin-dir flag's variable), Debian's postgresql-15, the newest
// other version under /usr/lib/postgresql, or initdb's directory on $PATH.
func Dir() string {
	if dir := os.Getenv("DBCLOUD_PG_BIN_DIR"); dir != "" {
		return dir
	}
	if hasInitdb(defaultBinDir) {
		return defaultBinDir
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, dir := range dirs {
		if hasInitdb(dir) {
			return dir
		}
	}
	if path, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(path)
	}
	return defaultBinDir
}

func hasInitdb(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, "initdb"))
	return err == nil && fi.Mode().IsRegular()
}

// pgVersion extracts N from /usr/lib/postgresql/N/bin so that 16 sorts above
// 9.6; unparsable names sort last.
func pgVersion(binDir string) float64 {
	v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	if err != nil {
		return -1
	}
	return v
}

// debianRoot holds Debian's per-version directories, /usr/lib/postgresql/N.
const debianRoot = "/usr/lib/postgresql"

// Installed finds the binary directories of every PostgreSQL major
// version installed in Debian's layout under root ("" is
// /usr/lib/postgresql): N/bin with initdb and postgres, by major.
func Installed(root string) map[int]string {
	if root == "" {
		root = debianRoot
	}
	out := map[int]string{}
	dirs, _ := filepath.Glob(filepath.Join(root, "*", "bin"))
	for _, dir := range dirs {
		major, err := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
		if err != nil || major < 10 || !hasInitdb(dir) {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, "postgres")); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		out[major] = dir
	}
	return out
}

// Version reports the version of the server in binDir from
// `postgres --version` ("postgres (PostgreSQL) 17.12 (Debian ...)"): its
// major and its full version, "17.12".
func Version(binDir string) (major int, full string, err error) {
	out, err := exec.Command(filepath.Join(binDir, "postgres"), "--version").Output()
	if err != nil {
		return 0, "", fmt.Errorf("%s --version: %w", filepath.Join(binDir, "postgres"), err)
	}
	return parseVersion(string(out))
}

// parseVersion reads the output of `postgres --version`.
func parseVersion(out string) (int, string, error) {
	fields := strings.Fields(out)
	if len(fields) < 3 || fields[0] != "postgres" || fields[1] != "(PostgreSQL)" {
		return 0, "", fmt.Errorf("unexpected postgres --version output %q", strings.TrimSpace(out))
	}
	full := fields[2]
	num, _, _ := strings.Cut(full, ".")
	major, err := strconv.Atoi(num)
	if err != nil || major < 10 {
		return 0, "", fmt.Errorf("unexpected PostgreSQL version %q", full)
	}
	return major, full, nil
}
