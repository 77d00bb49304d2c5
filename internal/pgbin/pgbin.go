// Package pgbin finds the PostgreSQL server binaries.
package pgbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
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
