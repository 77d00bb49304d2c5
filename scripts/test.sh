#!/usr/bin/env bash
# Runs every test, against both stores (the PostgreSQL store tests start
# their own throwaway server), plus the fuzz seed corpora, the short load
# test (e2e TestLoad), a race run of the concurrent store code, and every
# benchmark at tiny sizes through the benchmark runner: a smoke test that
# they and the report still work (into bench/out/short/), not a measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/deps.sh
# go.mod and go.sum say exactly what the code imports.
if ! go mod tidy -diff; then
	echo "go.mod or go.sum is not tidy: run go mod tidy" >&2
	exit 1
fi
go vet ./...
# runtime/kubernetes' tests start a real kube-apiserver and etcd: the
# single-node cluster's own, built once from the Go module proxy and cached
# (docs/kubernetes.md); never skipped here.
KUBEBUILDER_ASSETS=$(scripts/kube-test-assets.sh)
export KUBEBUILDER_ASSETS DBCLOUD_REQUIRE_KUBE=1
# e2e runs its tests one after another on real binaries and PostgreSQL (about
# 27 minutes on one 2-core machine, 37 to 40 on a slower one): its own
# bound, with room for a slower run still inside CI's 90 minutes. The log
# lists the slowest tests after the packages' lines.
go test -count=1 -timeout 55m -json ./... | go run ./cmd/dbcloud-testlog -slowest 25
go test -count=1 -race -timeout 10m ./sqlite/ ./http/
go run ./cmd/dbcloud-bench -short -check
# The Kubernetes runtime against real pods (issue 32, docs/kubernetes.md): a
# single-node cluster with CloudNativePG built on this machine from Go
# modules and Debian packages, cached under /var/cache/dbcloud/kube-node
# (the first run on a fresh machine builds for 17 to 40 minutes, by the
# machine; later runs take seconds). A whole fresh run: docs/kubernetes.md. One cluster for both: the check proves it (a CNPG cluster
# healthy, TLS from the host, a failover), the e2e suite runs with
# -e2e.runtime=kubernetes against it, then `down` and the check that nothing
# is left. The check's own backup part is skipped here: the suite's
# TestRuntime_Forks takes the same object store, plugin backups and
# point-in-time recovery through dbcloud (scripts/kube-backup-check.sh runs it).
KUBE_CHECK_BACKUPS=0 KUBE_CHECK_E2E=1 scripts/kube-node-check.sh
