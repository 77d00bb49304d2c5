package dbcloud

import (
	"slices"
	"strconv"
	"strings"
)

// PGVersion is a PostgreSQL major version an installation runs
// (decisions.md section 11), with the full version of its binaries.
type PGVersion struct {
	Major int    // 17
	Full  string // "17.12", as `postgres --version` reports it
	// Extensions lists the extensions this version can create, which the
	// addons need.
	Extensions map[string]bool
}

// PGVersionUnknown is the major version of a service recorded before
// services chose one: every such service runs PostgreSQL 15, the only
// version there was (the stores' migration writes it into their rows).
const PGVersionUnknown = 0

// ChoosePGVersion resolves the major version a create asks for (nil: not
// given) against the installation's versions: the newest when none is
// given; a KindInvalid error listing the versions there are otherwise.
func ChoosePGVersion(want *int, have []PGVersion) (PGVersion, error) {
	if len(have) == 0 {
		return PGVersion{}, Errorf(KindUnavailable, "This installation has no PostgreSQL version to run services on.")
	}
	sorted := slices.SortedFunc(slices.Values(have), func(a, b PGVersion) int { return a.Major - b.Major })
	if want == nil {
		return sorted[len(sorted)-1], nil
	}
	for _, v := range sorted {
		if v.Major == *want {
			return v, nil
		}
	}
	return PGVersion{}, Errorf(KindInvalid, "pg_version %d is not available; this installation runs PostgreSQL %s.",
		*want, ListPGVersions(sorted))
}

// FindPGVersion returns major's entry in have; ok is false when the
// installation does not run it (any more).
func FindPGVersion(major int, have []PGVersion) (v PGVersion, ok bool) {
	i := slices.IndexFunc(have, func(v PGVersion) bool { return v.Major == major })
	if i < 0 {
		return PGVersion{Major: major}, false
	}
	return have[i], true
}

// ListPGVersions names the majors as an error message lists them: "15, 17".
func ListPGVersions(vs []PGVersion) string {
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = strconv.Itoa(v.Major)
	}
	return strings.Join(names, ", ")
}
