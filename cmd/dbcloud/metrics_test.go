package main

import (
	"io"
	"testing"
)

func TestFlags_Metrics(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		for _, addr := range []string{"127.0.0.1:9187", "[::1]:9187", "localhost:9187", "127.0.0.2:0"} {
			if err := NewMain(io.Discard).ParseFlags([]string{"--metrics-listen", addr}); err != nil {
				t.Errorf("--metrics-listen %s: %v", addr, err)
			}
		}
		m := NewMain(io.Discard)
		if err := m.ParseFlags(nil); err != nil || m.Config.Metrics.Listen != "" {
			t.Errorf("default --metrics-listen %q, %v; want off", m.Config.Metrics.Listen, err)
		}
	})
	t.Run("ErrInvalid", func(t *testing.T) {
		for _, args := range [][]string{
			{"--metrics-listen", "0.0.0.0:9187"}, {"--metrics-listen", ":9187"}, {"--metrics-listen", "10.0.0.1:9187"},
			{"--metrics-listen", "example.com:9187"}, {"--metrics-listen", "nope"},
			{"--metrics-raw-retention", "0s"}, {"--metrics-minute-retention", "1h"},
		} {
			if err := NewMain(io.Discard).ParseFlags(args); err == nil {
				t.Errorf("ParseFlags(%v) accepted", args)
			}
		}
	})
}
