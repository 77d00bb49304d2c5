# What the cluster's check scripts share (scripts/kube-node-check.sh,
# scripts/kube-backup-check.sh): sourced after CHECK names the check in its
# log lines. Each number goes out as one "measure: ..." line on stdout.
log() { echo "dbcloud: $CHECK: $*" >&2; }
die() {
	log "FAILED: $*"
	exit 1
}
measure() { echo "measure: $*"; }
now_ms() { date +%s%3N; }
# secs FROM_MS TO_MS prints the seconds between, to a tenth.
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1000 }'; }

# poll WHAT SECONDS CMD... runs CMD until it succeeds or the deadline passes.
poll() {
	local what=$1 deadline=$(($(date +%s) + $2))
	shift 2
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$deadline" ] || die "$what: not within the deadline"
		sleep 0.5
	done
}

# delete_namespace KUBECONFIG NAMESPACE SECONDS deletes a check's namespace: its Clusters first,
# then, once their pods are gone, the namespace. Deleting the namespace while CNPG's pods still
# terminate can take a quarter of an hour: the namespace controller, finding pods left, looks
# again only after half their grace period (CNPG's stopDelay, 1800 s by default); a CI run's
# check waited 300 s for a namespace whose pods had gone in the first 25.
delete_namespace() {
	local kc=$1 ns=$2 seconds=$3
	kubectl --kubeconfig "$kc" -n "$ns" delete clusters.postgresql.cnpg.io --all --wait=true --timeout="${seconds}s" >/dev/null
	poll "pods of namespace $ns gone" "$seconds" no_pods "$kc" "$ns"
	kubectl --kubeconfig "$kc" delete namespace "$ns" --wait=true --timeout="${seconds}s" >/dev/null
}
no_pods() { [ -z "$(kubectl --kubeconfig "$1" -n "$2" get pods -o name)" ]; }

# small_cluster NAME NAMESPACE IMAGE [MORE_SPEC_YAML] prints a one-instance CNPG Cluster of an
# image built here, small enough for the 2-core node to hold beside the e2e run's services.
small_cluster() {
	cat <<EOF
apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata: {name: $1, namespace: $2}
spec:
  instances: 1
  imageName: $3
  imagePullPolicy: Never
  storage: {size: 1Gi}
  resources:
    requests: {cpu: 100m, memory: 256Mi}
    limits: {memory: 512Mi}
${4:-}
EOF
}
