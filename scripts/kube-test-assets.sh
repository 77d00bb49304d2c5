#!/usr/bin/env bash
# Builds the kube-apiserver and etcd that runtime/kubernetes' tests start
# (controller-runtime's envtest, KUBEBUILDER_ASSETS) and prints the
# directory that holds them. Both come from the Go module proxy through the
# separate tools module tools/kube (Kubernetes and etcd versions pinned
# there): no kubelet, no images, nothing from other download sites.
#
# The binaries are kept under $DBCLOUD_KUBE_CACHE/<kubernetes version>-<hash>,
# where the hash covers tools/kube/go.mod, go.sum and the Go version: the
# first build takes minutes (see docs/kubernetes.md for the time measured),
# later runs with the same pins print the directory and do no work.
#
#   scripts/kube-test-assets.sh      build when missing, print the directory
#   scripts/kube-test-assets.sh -n   print the directory only when already built
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tools="$here/../tools/kube"
CACHE=${DBCLOUD_KUBE_CACHE:-/var/cache/dbcloud/kube}
export PATH="$PATH:/usr/local/go/bin"

log() { echo "dbcloud: kube test assets: $*" >&2; }

version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$tools/go.mod")
[ -n "$version" ] || { log "no k8s.io/kubernetes version in $tools/go.mod"; exit 1; }
hash=$({ go env GOVERSION; cat "$tools/go.mod" "$tools/go.sum"; } | sha256sum | cut -c1-16)
dir="$CACHE/$version-$hash"

built() { [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; }

if built; then
	echo "$dir"
	exit 0
fi
if [ "${1:-}" = "-n" ]; then
	exit 1
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if built; then
	echo "$dir"
	exit 0
fi

log "building kube-apiserver $version and etcd into $dir (once; several minutes)"
tmp=$(mktemp -d "$CACHE/.build.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
(
	cd "$tools"
	# -mod=readonly: go.sum is the pin; a missing sum fails instead of resolving anew.
	go build -mod=readonly -trimpath -ldflags='-s -w' -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
	go build -mod=readonly -trimpath -ldflags='-s -w' -o "$tmp/etcd" go.etcd.io/etcd/server/v3
)
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
# Older builds of other pins are left for their checkouts; they are only disk.
echo "$dir"
