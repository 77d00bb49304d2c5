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
# On a fresh machine the cluster's binaries and images (Kubernetes, CloudNativePG, MinIO, the
# barman-cloud plugin, Debian roots, this checkout's static dbcloud) take about 30 minutes to
# build; they need only what deps.sh installed, so they build now, at the lowest CPU and I/O
# priority (the tests' PostgreSQL servers sync), while the Go tests below mostly wait on
# PostgreSQL, and the Kubernetes checks at the end wait for them. Its own session, so that an
# early exit stops the whole build by its process group.
kube_prepare_log=$(mktemp "${TMPDIR:-/tmp}/dbcloud-kube-prepare.XXXXXX")
setsid nice -n 19 ionice -c 3 bash -c 'scripts/kube-node.sh prepare && scripts/kube-images.sh dbcloud >/dev/null' \
	>"$kube_prepare_log" 2>&1 </dev/null &
kube_prepare=$!
trap 'kill -- -"$kube_prepare" 2>/dev/null || true; rm -f "$kube_prepare_log"' EXIT
# go.mod and go.sum say exactly what the code imports.
if ! go mod tidy -diff; then
	echo "go.mod or go.sum is not tidy: run go mod tidy" >&2
	exit 1
fi
go vet ./...
# runtime/kubernetes' tests start a real kube-apiserver and etcd, the cluster's own (the
# build above makes them first; this waits for it) (docs/kubernetes.md); never skipped here.
KUBEBUILDER_ASSETS=$(scripts/kube-test-assets.sh)
export KUBEBUILDER_ASSETS DBCLOUD_REQUIRE_KUBE=1
# e2e runs its tests one after another on real binaries and PostgreSQL (about
# 27 minutes on this 2-core kind of machine with warm caches; on a fresh one
# the builds above share the machine with it): its own bound.
go test -count=1 -timeout 60m ./...
go test -count=1 -race -timeout 10m ./sqlite/ ./http/
go run ./cmd/dbcloud-bench -short -check
# The Kubernetes runtime against real pods (issue 32, docs/kubernetes.md): a
# single-node cluster with CloudNativePG built on this machine from Go
# modules and Debian packages, cached under /var/cache/dbcloud/kube-node
# (built beside the Go tests above on a fresh machine; the checks take about
# 6 minutes once it is built). The check proves the cluster (a CNPG cluster healthy, TLS
# from the host, a failover, nothing left after down); then the e2e suite
# runs with -e2e.runtime=kubernetes against it.
kube_prepare_rc=0
wait "$kube_prepare" || kube_prepare_rc=$?
sed 's/^/kube prepare: /' "$kube_prepare_log"
[ "$kube_prepare_rc" -eq 0 ] || { echo "scripts/kube-node.sh prepare failed (exit $kube_prepare_rc)" >&2; exit 1; }
scripts/kube-node-check.sh
scripts/e2e-kube.sh
