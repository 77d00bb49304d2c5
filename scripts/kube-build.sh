#!/usr/bin/env bash
# Builds the Go binaries of the single-node cluster (scripts/kube-node.sh) from one of the
# separate tools modules and prints the directory that holds them:
#
#   scripts/kube-build.sh kube-node   kubelet, kube-apiserver, kube-controller-manager,
#                                     kube-scheduler, kube-proxy, kubectl, etcd
#   scripts/kube-build.sh cnpg        CloudNativePG's manager (the operator image's binary)
#   scripts/kube-build.sh coredns     CoreDNS without forwarding (tools/coredns/main.go)
#   scripts/kube-build.sh minio       MinIO's server, the cluster's S3 object store for backups
#   scripts/kube-build.sh barman-cloud  the barman-cloud plugin's manager (operator and sidecar)
#   scripts/kube-build.sh -n MODULE   print the directory only when already built
#
# Everything comes from the Go module proxy; go.sum is the pin (-mod=readonly: a missing sum
# fails instead of resolving anew). minio and barman-cloud are built inside their own module's
# directory, with their own go.mod and go.sum as the pin: a wrapper module would drop their
# replace directives and re-resolve what they chose. The module itself is pinned by version in
# kube-node.env and checked against the Go checksum database when downloaded. The binaries are kept under
# $KUBE_CACHE/bin/<module>-<hash>, the hash covering the module's go.mod, go.sum, its Go
# sources and the Go version, so an unchanged pin costs nothing and a new one builds once.
# Static (CGO_ENABLED=0): the binaries go into images with no libc.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=kube-node.env
. "$here/kube-node.env"
export PATH="$PATH:/usr/local/go/bin"

only_built=
if [ "${1:-}" = -n ]; then
	only_built=1
	shift
fi
mod=${1:?usage: kube-build.sh [-n] kube-node|cnpg|coredns|minio|barman-cloud}
log() { echo "dbcloud: kube build $mod: $*" >&2; }
# own MODULE VERSION: the module's directory in the module cache, downloaded when missing.
own() {
	local dir
	dir=$(cd / && GOFLAGS=-mod=mod go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -f "$dir/go.mod" ] || { log "could not download $1@$2"; exit 1; }
	echo "$dir"
}
case "$mod" in
minio) tools=$(own github.com/minio/minio "$MINIO_VERSION") ;;
barman-cloud) tools=$(own github.com/cloudnative-pg/plugin-barman-cloud "$BARMAN_PLUGIN_VERSION") ;;
*)
	tools="$here/../tools/$mod"
	[ -f "$tools/go.mod" ] || { echo "kube-build.sh: no module tools/$mod" >&2; exit 2; }
	;;
esac

# The env file is the pin people read; the go.mod is the one Go reads: refuse to build when
# they disagree, so the documented version is the built one.
pinned() { # module version
	grep -Eq "^[[:space:]]*(require )?$1 $2( |$)" "$tools/go.mod" ||
		{ log "tools/$mod/go.mod does not pin $1 $2 (scripts/kube-node.env)"; exit 1; }
}
case "$mod" in
kube-node)
	pinned k8s.io/kubernetes "$KUBE_VERSION"
	pinned go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
	;;
cnpg) pinned github.com/cloudnative-pg/cloudnative-pg "$CNPG_VERSION" ;;
coredns) pinned github.com/coredns/coredns "$COREDNS_VERSION" ;;
minio | barman-cloud) ;; # the module's own directory is the version
*) log "unknown module"; exit 2 ;;
esac

# A module cache directory never changes (its path holds the version): hashing its thousands of
# sources would only slow every `up`.
srcs() { case "$tools" in "$here"/*) find "$tools" -name '*.go' -print0 | sort -z | xargs -0r cat ;; *) echo "$tools" ;; esac; }
hash=$({ go env GOVERSION; cat "$tools/go.mod" "$tools/go.sum"; srcs; } | sha256sum | cut -c1-16)
dir="$KUBE_CACHE/bin/$mod-$hash"
[ -f "$dir/complete" ] && { echo "$dir"; exit 0; }
[ -z "$only_built" ] || exit 1

mkdir -p "$KUBE_CACHE/bin"
exec 9>"$KUBE_CACHE/bin/.lock"
flock 9
[ -f "$dir/complete" ] && { echo "$dir"; exit 0; }

start=$(date +%s)
tmp=$(mktemp -d "$KUBE_CACHE/bin/.build.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
build() { # ldflags output package
	log "building $(basename "$2")"
	(cd "$tools" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags="-s -w $1" -o "$tmp/$2" "$3")
}
case "$mod" in
kube-node)
	# Without -X the components report v0.0.0, and the kubelet's version is what the Node shows.
	v="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
	for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
		build "$v" "$c" "k8s.io/kubernetes/cmd/$c"
	done
	build "" etcd go.etcd.io/etcd/server/v3
	;;
cnpg)
	build "-X github.com/cloudnative-pg/cloudnative-pg/pkg/versions.buildVersion=${CNPG_VERSION#v}" \
		manager github.com/cloudnative-pg/cloudnative-pg/cmd/manager
	;;
coredns) build "" coredns . ;;
# MinIO's release stamps (cmd.Version) are parsed as release times: left at its default, the
# server reports DEVELOPMENT.GOGET; the version is the pin in kube-node.env.
minio) build "" minio . ;;
barman-cloud) build "" manager ./cmd/manager ;;
esac
touch "$tmp/complete"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
log "built in $(($(date +%s) - start)) s into $dir"
echo "$dir"
