package pglog

import (
	"strings"
)

// Matcher applies a Query's filters (Since, Until, Severities, Search) to
// entries that come from elsewhere than log files, such as a Kubernetes
// pod's log, so every runtime filters exactly as the local one does.
type Matcher struct{ f *filter }

// NewMatcher compiles q's filters; an unknown severity is an error of kind
// dbcloud.KindInvalid, as for Reader.Read.
func NewMatcher(q Query) (*Matcher, error) {
	f, err := newFilter(q, nil)
	if err != nil {
		return nil, err
	}
	return &Matcher{f: f}, nil
}

// Match reports whether e passes the filters. Its Severity is compared
// as PostgreSQL writes error_severity (DEBUG for every DEBUGn).
func (m *Matcher) Match(e Entry) bool {
	if m.f.checkTime(e.Timestamp) != matched {
		return false
	}
	if m.f.sevs != nil && !m.f.sevs[strings.ToUpper(e.Severity)] {
		return false
	}
	if len(m.f.terms) > 0 {
		msg := fold(e.Message)
		for _, t := range m.f.terms {
			if !strings.Contains(msg, t) {
				return false
			}
		}
	}
	return true
}
