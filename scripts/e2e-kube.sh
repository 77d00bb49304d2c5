#!/usr/bin/env bash
# Runs the e2e suite against real pods: brings up the single-node cluster with CloudNativePG
# (scripts/kube-node.sh), runs `go test ./e2e/` with -e2e.runtime=kubernetes against it, and
# takes the cluster down again whatever the result (KUBE_KEEP=1 leaves it up). Run as root from
# the module root; `make e2e-kube` calls it.
#
# Services are exposed as NodePorts on the node's bridge address (the only address kube-proxy
# serves them on), on the port each dbcloud server claims: the apiserver's node port range
# covers the e2e suite's port blocks (scripts/kube-node.env). The PostgreSQL images, 15 and 17,
# are the ones built here, with TimescaleDB, pgvector and dbcloud_guard (which every instance
# preloads).
#
#   E2E_RUN    -run pattern (default: the whole suite; local-only tests skip, saying why)
#   E2E_ARGS   more go test flags
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=kube-node.env
. "$here/kube-node.env"
export PATH="$PATH:/usr/local/go/bin"
log() { echo "dbcloud: e2e-kube: $*" >&2; }

start=$(date +%s)
kc=$("$here/kube-node.sh" up)
log "cluster up in $(($(date +%s) - start)) s: $kc"
if [ "${KUBE_KEEP:-}" != 1 ]; then
	trap '"$here/kube-node.sh" down' EXIT
fi
cd "$here/.."
t=$(date +%s)
rc=0
# shellcheck disable=SC2086 # E2E_ARGS are go test flags
go test -count=1 -timeout 90m -v ${E2E_ARGS:-} ./e2e/ ${E2E_RUN:+-run "$E2E_RUN"} -args \
	-e2e.runtime=kubernetes -e2e.kubeconfig="$kc" \
	-e2e.kube-args="--kube-expose nodeport --public-host $KUBE_NODE_IP --kube-image $KUBE_IMAGE_POSTGRES --kube-images 17=$KUBE_IMAGE_POSTGRES17 --kube-extensions timescaledb,vector --kube-guard --kube-object-store $KUBE_OBJSTORE_NS/$KUBE_OBJSTORE_TEMPLATE" ||
	rc=$?
log "go test finished in $(($(date +%s) - t)) s (exit $rc)"
exit "$rc"
