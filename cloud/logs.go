package cloud

import (
	"context"

	"dbcloud"
)

// Logs returns a page of a service's log lines.
func (c *Cloud) Logs(ctx context.Context, projectID, id string, q dbcloud.LogQuery) (*dbcloud.LogPage, error) {
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
			return nil, dbcloud.Errorf(dbcloud.KindInvalid, "node %d does not exist; service %s has nodes 0 to %d.", *q.Node, id, nodes-1)
		}
	}
	if q.Since != nil && q.Until != nil && !q.Since.Before(*q.Until) {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "since must be before until.")
	}
	if q.Limit <= 0 || q.Limit > dbcloud.MaxLogEntries {
		q.Limit = dbcloud.MaxLogEntries
	}
	return c.Runtime.Logs(ctx, v.Service, q)
}
