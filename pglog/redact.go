package pglog

import (
	"sort"
	"strings"
)

// PathName is a host path and the neutral name a tenant sees in its place.
type PathName struct {
	Path string
	// Name should be of the form <word>: a search term can then match
	// inside a name only if it lies within the brackets (see hides).
	Name string
}

// Redactor rewrites the host paths in log messages into neutral names.
// PostgreSQL writes absolute paths in lines a tenant reads: the Unix
// socket it listens on, a configuration file it could not read, an
// extension control file that is missing, the directory of a failed
// archive; they tell the tenant where dbcloud keeps every service on the
// host and which OS layout it runs on, and nothing the tenant can act on.
type Redactor struct {
	r     *strings.Replacer
	names []string // folded
}

// NewRedactor returns a Redactor for paths: where one path is a prefix of
// another, the longer is replaced first, so each occurrence gets its most
// specific name. Empty paths and names are ignored; a trailing slash is not
// part of a path.
func NewRedactor(paths []PathName) *Redactor {
	ps := make([]PathName, 0, len(paths))
	for _, p := range paths {
		p.Path = strings.TrimRight(p.Path, "/")
		if p.Path != "" && p.Name != "" {
			ps = append(ps, p)
		}
	}
	// strings.Replacer tries its old strings in argument order at each
	// position: the longest path must come first.
	sort.SliceStable(ps, func(i, j int) bool { return len(ps[i].Path) > len(ps[j].Path) })
	red := &Redactor{}
	args := make([]string, 0, 2*len(ps))
	for _, p := range ps {
		args = append(args, p.Path, p.Name)
		red.names = append(red.names, fold(p.Name))
	}
	red.r = strings.NewReplacer(args...)
	return red
}

// Redact returns msg with every host path in it replaced by its name.
func (red *Redactor) Redact(msg string) string {
	if red == nil {
		return msg
	}
	return red.r.Replace(msg)
}

// hides reports whether a folded search term could match within a name:
// such a term may be in a redacted message without being in the raw line,
// so the raw byte search must not be trusted for it. A term that is not
// inside a name and holds no '<' or '>' matches a redacted message only in
// text that was there before redaction.
func (red *Redactor) hides(term string) bool {
	if red == nil {
		return false
	}
	for _, n := range red.names {
		if strings.Contains(n, term) {
			return true
		}
	}
	return false
}
