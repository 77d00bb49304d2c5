package engine

import (
	"context"
	"time"

	"dbcloud"
)

// HistoryPruneInterval is how often the metrics history is pruned to its
// tiers' retention: often enough that the store holds little beyond it.
const HistoryPruneInterval = time.Minute

// recordHistory writes one health round's samples in one batch, and
// prunes the history when due. History is optional: without it (or a store
// that keeps none) samples are dropped.
func (e *Engine) recordHistory(ctx context.Context, samples []dbcloud.SeriesSample) {
	if e.History == nil {
		return
	}
	if len(samples) > 0 {
		if err := e.History.Record(ctx, samples); err != nil && ctx.Err() == nil {
			e.Logger.Warn("record metrics history", "samples", len(samples), "error", err)
		}
	}
	e.mu.Lock()
	due := e.now().Sub(e.pruned) >= HistoryPruneInterval
	if due {
		e.pruned = e.now()
	}
	e.mu.Unlock()
	if !due {
		return
	}
	if n, err := e.History.Prune(ctx); err != nil && ctx.Err() == nil {
		e.Logger.Warn("prune metrics history", "error", err)
	} else if n > 0 {
		e.Logger.Debug("pruned metrics history", "rows", n)
	}
}
