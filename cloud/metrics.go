package cloud

import (
	"context"

	"dbcloud"
)

// AvailableMetricSeries lists the series names of a service
// (decisions.md section 1, the original's metrics preview).
func (c *Cloud) AvailableMetricSeries(ctx context.Context, projectID, id string) ([]string, error) {
	if _, err := c.GetService(ctx, projectID, id); err != nil {
		return nil, err
	}
	return dbcloud.AvailableSeries(), nil
}

// MetricSeries answers a query over a service's recorded samples.
func (c *Cloud) MetricSeries(ctx context.Context, projectID, id string, q dbcloud.SeriesQuery) ([]dbcloud.SeriesResult, error) {
	if _, err := c.GetService(ctx, projectID, id); err != nil {
		return nil, err
	}
	if c.History == nil {
		return nil, dbcloud.Errorf(dbcloud.KindUnavailable, "This server keeps no metrics history.")
	}
	return c.History.Query(ctx, id, q)
}
