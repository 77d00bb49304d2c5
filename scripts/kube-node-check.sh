#!/usr/bin/env bash
# Proves the single-node cluster of scripts/kube-node.sh end to end and measures it
# (docs/kubernetes.md, "Measured"):
#
#   1. `kube-node.sh up` (timed; run twice with KUBE_CHECK_WARM=1 to time a warm second up
#      after a down),
#   2. a one-instance CloudNativePG Cluster with our PostgreSQL image becomes healthy (timed),
#   3. psql from the host reaches it over TLS on the pod network (the node's own bridge),
#      verifying CNPG's CA, and writes a row,
#   4. two instances: the replica streams (timed), the row is on it; the primary pod is deleted
#      and CNPG promotes the replica (timed until the -rw Service accepts a write again), and
#      the row survived,
#   5. backups (scripts/kube-backup-check.sh): WAL archive, a plugin Backup, recovery from it
#      and from the archive to a point in time (timed; KUBE_CHECK_BACKUPS=0 skips it),
#   6. `kube-node.sh down`, then checks that nothing is left: no process started from the
#      cluster's binaries or containerd, no bridge or veth, no DBCLOUD-KUBE-*/KUBE-* iptables
#      chains (IPv4 and IPv6), no mounts under the state directories or /run/netns, no
#      kubepods cgroups, the state directories gone, host paths as before, sysctls as before.
#
# Each wait polls with a deadline. Run as root; prints one "measure: ..." line per number.
# KUBE_CHECK_KEEP=1 leaves the cluster up (skips 6), whatever the result; otherwise a failed
# check takes it down too. KUBE_CHECK_E2E=1 runs the e2e suite against the same cluster
# (scripts/e2e-kube.sh) between 5 and 6, so that CI starts it once and checks what the suite's
# pods leave behind as well; the script then fails if the suite did.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=kube-node.env
. "$here/kube-node.env"
CHECK="kube-node check"
# shellcheck source=kube-check-lib.sh
. "$here/kube-check-lib.sh"

sysctl_snapshot() {
	local s
	for s in net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables vm.overcommit_memory vm.panic_on_oom \
		kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes \
		net.ipv4.conf.all.route_localnet; do
		echo "$s=$(sysctl -n "$s" 2>/dev/null)"
	done
}
hostpaths_snapshot() { for p in /var/lib/cni /var/log/containers /run/netns /etc/cni /var/lib/kubelet /var/log/pods /var/lib/containerd /opt/containerd; do [ -e "$p" ] && echo "$p"; done; true; }

before_sysctls=$(sysctl_snapshot)
before_paths=$(hostpaths_snapshot)

dir=$(mktemp -d)
finish() {
	local rc=$?
	rm -rf "$dir"
	if [ "$rc" -ne 0 ] && [ "${KUBE_CHECK_KEEP:-}" != 1 ] && [ -z "${down_done:-}" ]; then
		"$here/kube-node.sh" down || true
	fi
}
trap finish EXIT

t=$(now_ms)
kc=$("$here/kube-node.sh" up)
measure "kube-node.sh up: $(secs "$t" "$(now_ms)") s"
if [ "${KUBE_CHECK_WARM:-}" = 1 ]; then
	"$here/kube-node.sh" down
	t=$(now_ms)
	kc=$("$here/kube-node.sh" up)
	measure "kube-node.sh up after down (warm caches): $(secs "$t" "$(now_ms)") s"
fi
export PATH="$(cat "$KUBE_STATE/bin"):$PATH"
k() { kubectl --kubeconfig "$kc" "$@"; }

ns=dbcloud-check
k delete namespace "$ns" --ignore-not-found --wait=true >/dev/null
k create namespace "$ns" >/dev/null
t=$(now_ms)
small_cluster check "$ns" "$KUBE_IMAGE_POSTGRES" | k apply -f - >/dev/null
healthy() { # INSTANCES: CNPG says healthy, that many ready, and no switchover pending
	local phase ready cur tgt
	IFS='|' read -r phase ready cur tgt <<<"$(k -n "$ns" get cluster check \
		-o jsonpath='{.status.phase}|{.status.readyInstances}|{.status.currentPrimary}|{.status.targetPrimary}')"
	[ "$phase" = "Cluster in healthy state" ] && [ "$ready" = "$1" ] && [ -n "$cur" ] && [ "$cur" = "$tgt" ]
}
poll "one-instance cluster healthy" 600 healthy 1
measure "one-instance Cluster created to healthy: $(secs "$t" "$(now_ms)") s"

# Connection over TLS, verifying CNPG's CA: the client checks the chain (verify-ca; the pod
# IP is not one of the certificate's names, which are CNPG's Service names).
k -n "$ns" get secret check-ca -o jsonpath='{.data.ca\.crt}' | base64 -d >"$dir/ca.crt"
pw=$(k -n "$ns" get secret check-app -o jsonpath='{.data.password}' | base64 -d)
rw=$(k -n "$ns" get service check-rw -o jsonpath='{.spec.clusterIP}')
primary_ip() { k -n "$ns" get pod "$(k -n "$ns" get cluster check -o jsonpath='{.status.currentPrimary}')" -o jsonpath='{.status.podIP}'; }
sql() { # HOST SQL
	PGPASSWORD=$pw PGCONNECT_TIMEOUT=3 psql "host=$1 port=5432 dbname=app user=app sslmode=verify-ca sslrootcert=$dir/ca.crt" -Atqc "$2"
}
ip=$(primary_ip)
case "$ip" in "${KUBE_NODE_IP%.*}".*) ;; *) die "primary pod IP $ip is not on the cluster's bridge" ;; esac
[ "$(sql "$ip" 'SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()')" = t ] || die "psql to $ip is not TLS"
sql "$ip" "CREATE TABLE checked (v text); INSERT INTO checked VALUES ('kept')"
log "psql over TLS (verify-ca) to the primary pod $ip: ok; through the -rw Service $rw: $(sql "$rw" 'SELECT v FROM checked')"

# Two instances: streaming replication, then failover by deleting the primary pod.
t=$(now_ms)
k -n "$ns" patch cluster check --type merge -p '{"spec":{"instances":2}}' >/dev/null
poll "two-instance cluster healthy" 600 healthy 2
measure "second instance added to healthy (streaming): $(secs "$t" "$(now_ms)") s"
old=$(k -n "$ns" get cluster check -o jsonpath='{.status.currentPrimary}')
replica=$(k -n "$ns" get pods -l cnpg.io/cluster=check,cnpg.io/instanceRole=replica -o jsonpath='{.items[0].status.podIP}')
replicated() { [ "$(sql "$replica" 'SELECT v FROM checked')" = kept ]; }
poll "row replicated" 60 replicated
t=$(now_ms)
k -n "$ns" delete pod "$old" --wait=false >/dev/null
promoted() {
	local cur
	cur=$(k -n "$ns" get cluster check -o jsonpath='{.status.currentPrimary}')
	[ -n "$cur" ] && [ "$cur" != "$old" ] && sql "$rw" "INSERT INTO checked VALUES ('after failover')"
}
poll "failover" 300 promoted
measure "failover (primary pod deleted to a write through -rw on the promoted replica): $(secs "$t" "$(now_ms)") s"
[ "$(sql "$rw" "SELECT count(*) FROM checked")" = 2 ] || die "rows lost across the failover"
t=$(now_ms)
poll "old primary back as a replica" 300 healthy 2
measure "old primary rejoined as a replica: $(secs "$t" "$(now_ms)") s after the write"

delete_namespace "$kc" "$ns" 180
if [ "${KUBE_CHECK_BACKUPS:-1}" = 1 ]; then
	"$here/kube-backup-check.sh"
fi
e2e_rc=0
if [ "${KUBE_CHECK_E2E:-}" = 1 ]; then
	KUBE_KEEP=1 "$here/e2e-kube.sh" || e2e_rc=$?
fi
if [ "${KUBE_CHECK_KEEP:-}" = 1 ]; then
	log "cluster left up (KUBE_CHECK_KEEP=1): $kc"
	exit "$e2e_rc"
fi

t=$(now_ms)
bins=$(cat "$KUBE_STATE/bin")
down_done=1
"$here/kube-node.sh" down
measure "kube-node.sh down: $(secs "$t" "$(now_ms)") s"

# Nothing left behind.
left=0
leak() {
	log "left behind: $*"
	left=1
}
for pid in /proc/[0-9]*; do
	exe=$(readlink "$pid/exe" 2>/dev/null) || continue
	case "$exe" in "$bins"/* | "$KUBE_CACHE"/bin/* | /usr/bin/containerd*) leak "process ${pid#/proc/} ($exe)" ;; esac
done
# (if, not `&&`: a loop whose last test fails would end the script under set -e.)
if ip link show "$KUBE_BRIDGE" >/dev/null 2>&1; then leak "bridge $KUBE_BRIDGE"; fi
veths=$(ip -o link show type veth 2>/dev/null | cut -d: -f2 | tr '\n' ' ')
if [ -n "${veths// /}" ]; then leak "veth interfaces: $veths"; fi
for ipt in iptables ip6tables; do
	for table in filter nat mangle; do
		rules=$($ipt -w -t "$table" -S 2>/dev/null | grep -E 'DBCLOUD-KUBE|KUBE-' || true)
		if [ -n "$rules" ]; then leak "$ipt -t $table: $(echo "$rules" | tr '\n' ' ')"; fi
	done
done
mounts=$(awk -v s="$KUBE_STATE" -v r="$KUBE_RUN" 'index($5, s) == 1 || index($5, r) == 1 || index($5, "/run/netns/") == 1 { print $5 }' /proc/self/mountinfo | tr '\n' ' ')
if [ -n "$mounts" ]; then leak "mounts: $mounts"; fi
for c in /sys/fs/cgroup/*/kubepods; do
	if [ -d "$c" ]; then leak "cgroup $c"; fi
done
for d in "$KUBE_STATE" "$KUBE_RUN"; do
	if [ -e "$d" ]; then leak "directory $d"; fi
done
if [ "$(hostpaths_snapshot)" != "$before_paths" ]; then leak "host paths differ: before [$before_paths] after [$(hostpaths_snapshot)]"; fi
if [ "$(sysctl_snapshot)" != "$before_sysctls" ]; then
	leak "sysctls differ: $(diff <(echo "$before_sysctls") <(sysctl_snapshot) | grep '^[<>]' | tr '\n' ' ')"
fi
[ "$left" -eq 0 ] || die "down left things behind"
log "down left nothing: processes, bridge and veths, iptables (v4+v6), mounts, cgroups, directories, host paths, sysctls checked"
[ "$e2e_rc" -eq 0 ] || die "the e2e suite against the cluster failed (exit $e2e_rc)"
