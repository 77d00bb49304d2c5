#!/usr/bin/env bash
# Prints the directory that holds the kube-apiserver and etcd the Kubernetes runtime's tests
# start (controller-runtime's envtest, KUBEBUILDER_ASSETS). They are the single-node cluster's
# own binaries (scripts/kube-build.sh kube-node, pinned in scripts/kube-node.env): the tests'
# apiserver is the version CI's cluster runs, and one Kubernetes build serves both.
#
#   scripts/kube-test-assets.sh      build when missing (cached), print the directory
#   scripts/kube-test-assets.sh -n   print the directory only when already built
set -euo pipefail
case "${1:-}" in
"") exec "$(dirname "$0")/kube-build.sh" kube-node ;;
-n) exec "$(dirname "$0")/kube-build.sh" -n kube-node ;;
*)
	echo "usage: kube-test-assets.sh [-n]" >&2
	exit 2
	;;
esac
