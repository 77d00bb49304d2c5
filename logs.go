package dbcloud

import (
	"context"
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

// Logs returns a page of a service's log lines.
func (c *Cloud) Logs(ctx context.Context, projectID, id string, q LogQuery) (*LogPage, error) {
	v, err := c.GetService(ctx, projectID, id)
	if err != nil {
		return nil, err
	}
	if q.Node != nil {
		nodes := 1 + v.Service.Spec.Replicas
		if len(v.Service.Instances) > nodes {
			nodes = len(v.Service.Instances)
		}
		if *q.Node < 0 || *q.Node >= nodes {
			return nil, Errorf(KindInvalid, "node %d does not exist; service %s has nodes 0 to %d.", *q.Node, id, nodes-1)
		}
	}
	if q.Since != nil && q.Until != nil && !q.Since.Before(*q.Until) {
		return nil, Errorf(KindInvalid, "since must be before until.")
	}
	if q.Limit <= 0 || q.Limit > MaxLogEntries {
		q.Limit = MaxLogEntries
	}
	return c.Runtime.Logs(ctx, v.Service, q)
}
