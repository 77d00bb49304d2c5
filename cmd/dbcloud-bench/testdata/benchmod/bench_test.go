// Package benchmod holds benchmarks that pass and fail, for the runner's
// tests.
package benchmod

import "testing"

func BenchmarkOK(b *testing.B) {
	for b.Loop() {
	}
	b.ReportMetric(12.5, "p50-ms")
	b.ReportMetric(0, "ns/op")
}

func BenchmarkFails(b *testing.B) {
	b.Fatal("the server did not start")
}

func BenchmarkSkips(b *testing.B) {
	b.Skip("pgbench not installed")
}
