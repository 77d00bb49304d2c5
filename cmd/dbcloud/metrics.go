package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	stdhttp "net/http"
	"net/http/pprof"
	"net/netip"
	"time"

	"dbcloud"
	"dbcloud/http"
	"dbcloud/telemetry"
)

// MetricsConfig is what serve is told about metrics: where Prometheus
// scrapes, and how long the history behind the metrics preview is kept.
type MetricsConfig struct {
	// Listen is the Prometheus listener's address; empty: none.
	Listen string
	// RawRetention, MinuteRetention and HourRetention keep the history's
	// raw samples, 1-minute and 1-hour rollups.
	RawRetention, MinuteRetention, HourRetention time.Duration
	// Pprof adds Go's profiler (/debug/pprof/) to the Prometheus
	// listener, to profile a running server where it runs (the health
	// loop at many services, say); loopback only, like /metrics.
	Pprof bool
}

// DefaultMetricsConfig has no Prometheus listener, and the history of
// dbcloud.DefaultSeriesTiers.
func DefaultMetricsConfig() MetricsConfig {
	t := dbcloud.DefaultSeriesTiers
	return MetricsConfig{RawRetention: t[0].Retention, MinuteRetention: t[1].Retention, HourRetention: t[2].Retention}
}

func metricsFlags(fs *flag.FlagSet, c *MetricsConfig) {
	fs.StringVar(&c.Listen, "metrics-listen", c.Listen, "loopback HOST:PORT serving Prometheus /metrics over plain HTTP (empty: off)")
	fs.DurationVar(&c.RawRetention, "metrics-raw-retention", c.RawRetention, "keep every metrics sample this long")
	fs.DurationVar(&c.MinuteRetention, "metrics-minute-retention", c.MinuteRetention, "keep 1-minute metrics rollups this long")
	fs.DurationVar(&c.HourRetention, "metrics-hour-retention", c.HourRetention, "keep 1-hour metrics rollups this long")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "also serve Go's profiler under /debug/pprof/ on --metrics-listen")
}

// validate refuses a Prometheus listener off loopback: /metrics names every
// project and service and is served without TLS or authentication, so it
// stays on the host (a scraper elsewhere goes through an authenticating
// proxy the operator chooses).
func (c *MetricsConfig) validate() error {
	var errs []error
	if c.Listen != "" {
		host, _, err := net.SplitHostPort(c.Listen)
		if err != nil {
			errs = append(errs, fmt.Errorf("--metrics-listen %q: want HOST:PORT", c.Listen))
		} else if a, perr := netip.ParseAddr(host); host != "localhost" && (perr != nil || !a.IsLoopback()) {
			errs = append(errs, fmt.Errorf("--metrics-listen %q: must be a loopback address (127.0.0.1, ::1 or localhost); /metrics has no authentication", c.Listen))
		}
	}
	if c.Pprof && c.Listen == "" {
		errs = append(errs, errors.New("--pprof needs --metrics-listen: the profiler is served there"))
	}
	if c.RawRetention <= 0 || c.MinuteRetention < c.RawRetention || c.HourRetention < c.MinuteRetention {
		errs = append(errs, errors.New("--metrics-raw-retention, --metrics-minute-retention and --metrics-hour-retention must be above 0 and not shrink"))
	}
	return errors.Join(errs...)
}

func (c *MetricsConfig) tiers() []dbcloud.SeriesTier {
	return []dbcloud.SeriesTier{
		{Resolution: 0, Retention: c.RawRetention},
		{Resolution: time.Minute, Retention: c.MinuteRetention},
		{Resolution: time.Hour, Retention: c.HourRetention},
	}
}

// wireMetrics gives the engine the history, and, with --metrics-listen,
// hooks the handler and the engine to the Prometheus registry and starts
// its listener.
func (m *Main) wireMetrics(h *http.Handler) error {
	c := &m.Config.Metrics
	if hist := m.cloud.History; hist != nil {
		hist.Tiers = c.tiers()
		m.engine.History = hist
	}
	if c.Listen == "" {
		return nil
	}
	src := telemetry.Sources{Store: m.store, QueueDepth: m.engine.QueueDepth, LeasesHeld: m.engine.LeasesHeld}
	if m.runtime != nil { // the local runtime keeps a warm pool
		src.PoolReady, src.PoolTarget = m.runtime.PoolReady, m.runtime.PoolTarget
	}
	t := telemetry.New(src)
	h.Observe = t.ObserveRequest
	m.engine.Observe = t.ObserveReconcile
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("--metrics-listen: %w", err)
	}
	m.metricsListener = ln
	handler := t.Handler()
	if c.Pprof {
		mux := stdhttp.NewServeMux()
		mux.Handle("/", handler)
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		handler = mux
	}
	m.metricsServer = &stdhttp.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	m.goLoop(context.Background(), "metrics server", func(context.Context) { m.metricsServer.Serve(ln) })
	m.Logger.Info("serving Prometheus metrics", "url", m.MetricsURL())
	return nil
}

// MetricsURL is where Prometheus scrapes; empty without --metrics-listen.
func (m *Main) MetricsURL() string {
	if m.metricsListener == nil {
		return ""
	}
	return "http://" + m.metricsListener.Addr().String() + "/metrics"
}
