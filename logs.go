package dbcloud

import (
	"time"
)

// LogQuery selects log lines of a service (decisions.md section 8). Filters
// combine with AND.
type LogQuery struct {
	Cursor     string
	Node       *int
	Search     []string
	Severities []string
	Since      *time.Time
	Until      *time.Time
	Limit      int
}

// LogEntry is one log line of a PostgreSQL instance.
type LogEntry struct {
	Timestamp time.Time
	Severity  string
	Message   string
}

// LogPage is a page of log lines, newest first. Cursor is empty when no
// older entries exist.
type LogPage struct {
	Entries []LogEntry
	Cursor  string
}

// MaxLogEntries is the most entries one page holds.
const MaxLogEntries = 500
