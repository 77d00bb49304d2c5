#!/usr/bin/env bash
# A single-node Kubernetes cluster on this machine, with CloudNativePG, for running dbcloud's
# kubernetes runtime against real pods (docs/kubernetes.md):
#
#   scripts/kube-node.sh up       build what is missing (cached), start the cluster, print the
#                                 kubeconfig path on stdout (everything else goes to stderr)
#   scripts/kube-node.sh prepare  only build what is missing (host packages, binaries, images)
#   scripts/kube-node.sh down     stop and remove everything `up` made
#   scripts/kube-node.sh status   say what runs; exit 0 only when the node is Ready
#
# Run as root on Debian. Both are idempotent: `up` on a running cluster prints the kubeconfig,
# `down` on a clean machine does nothing.
#
# What runs: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy (Kubernetes from the Go module proxy, scripts/kube-build.sh), containerd with its
# own configuration and state directories, CoreDNS on the node's address, and pods on a bridge
# of the cluster's own (host-local addresses). Pins and addresses are in scripts/kube-node.env.
# For backups and WAL archives (scripts/kube-backup.sh): an S3 object store (MinIO) in the
# cluster and CloudNativePG's barman-cloud plugin, with a template ObjectStore for projects.
#
# Nothing can leave the machine:
#   - every image is built here (scripts/kube-images.sh) and imported; containerd's registry
#     configuration sends any pull to a closed loopback port, and CNPG's manifests and pods say
#     imagePullPolicy: Never;
#   - pods resolve names through the cluster's CoreDNS, which has no forward plugin, and the
#     kubelet's resolvConf is a file of ours, not the host's resolver;
#   - pods get routes to the Service range only, and iptables chains of ours drop forwarded
#     traffic that is not between the cluster's own pods, and pod traffic to the node other than
#     the apiserver and DNS.
#
# Nothing is killed by name: every process `up` starts has a pid file under $KUBE_RUN/pids, and
# `down` stops those pids; pods are stopped through containerd. The sysctls the kubelet and
# kube-proxy may change are recorded before the first start and restored by `down`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo="$here/.."
# shellcheck source=kube-node.env
. "$here/kube-node.env"
# shellcheck source=kube-backup.sh
. "$here/kube-backup.sh"
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"

log() { echo "dbcloud: kube-node: $*" >&2; }
die() {
	log "$*"
	exit 1
}

PKI=$KUBE_STATE/pki
PIDS=$KUBE_RUN/pids
LOGS=$KUBE_STATE/log
SOCK=$KUBE_RUN/containerd.sock
ADMIN=$KUBE_STATE/admin.kubeconfig
CTR() { ctr --address "$SOCK" -n k8s.io "$@"; }
# The sysctls the kubelet (its kernel defaults) and kube-proxy write, and the ones `up` sets.
SYSCTLS="net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables vm.overcommit_memory vm.panic_on_oom
kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes
net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max"
# Host paths the kubelet, containerd and CNI use whatever their configuration says (the
# kubelet's device plugin socket is under /var/lib/kubelet whatever its --root-dir); `down`
# removes each only when `up` created it (recorded in $KUBE_STATE/created).
HOSTPATHS="/var/lib/cni /var/log/containers /run/netns /etc/cni /var/lib/kubelet"

# The images every `up` imports (scripts/kube-images.sh).
IMAGES="pause postgres postgres17 operator pgbouncer minio barman-plugin barman-sidecar"

# now_ms prints the time in milliseconds, for the measured durations in the log.
now_ms() { date +%s%3N; }

# ---------------------------------------------------------------------------------------
# Processes: started detached, each with a pid file; stopped by that pid only.

# alive NAME succeeds when NAME's recorded pid is a live process of the recorded command.
alive() {
	local f="$PIDS/$1.pid" pid
	[ -f "$f" ] || return 1
	pid=$(cat "$f")
	[ -d "/proc/$pid" ] || return 1
	# A recycled pid is not ours: the executable must be the one we started.
	[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(cat "$PIDS/$1.exe")" ]
}

# start NAME BIN ARGS... runs BIN in its own session, logging to $LOGS/NAME.log.
start() {
	local name=$1
	shift
	if alive "$name"; then
		return 0
	fi
	mkdir -p "$PIDS" "$LOGS"
	setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$PIDS/$name.pid"
	readlink -f "$1" >"$PIDS/$name.exe"
	log "started $name (pid $!, log $LOGS/$name.log)"
}

# stop NAME sends SIGTERM to NAME's pid, then SIGKILL after 20 s, and waits for it to go.
stop() {
	local name=$1 pid i
	if alive "$name"; then
		pid=$(cat "$PIDS/$name.pid")
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < 200; i++)); do
			[ -d "/proc/$pid" ] || break
			# A zombie is gone for our purpose; its parent (a subshell of `up`) is gone too.
			[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && break
			sleep 0.1
		done
		if [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; then
			log "$name (pid $pid) did not stop on SIGTERM; SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		log "stopped $name (pid $pid)"
	fi
	rm -f "$PIDS/$name.pid" "$PIDS/$name.exe"
}

# wait_for WHAT SECONDS CMD... polls CMD until it succeeds or the deadline passes.
wait_for() {
	local what=$1 secs=$2 deadline
	shift 2
	deadline=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$deadline" ] || die "$what: not ready after ${secs}s (logs in $LOGS)"
		sleep 0.5
	done
}

# ---------------------------------------------------------------------------------------
# Host preparation.

host_packages() {
	[ -f /etc/debian_version ] || die "Debian only (packages come from the host's Debian release)"
	local need=() p
	for p in containerd runc containernetworking-plugins iptables mmdebstrap gcc openssl iproute2 util-linux; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
	done
	if [ "${#need[@]}" -gt 0 ]; then
		log "installing ${need[*]} (Debian)"
		apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
	fi
	# Debian's containerd package would start its own daemon under systemd; this machine has
	# no systemd as PID 1 and ours runs with its own configuration, so nothing else to do.
}

# record_host notes, once per up/down cycle, the sysctls and which host paths exist.
record_host() {
	[ -f "$KUBE_STATE/sysctls" ] && return 0
	mkdir -p "$KUBE_STATE"
	local s p
	for s in $SYSCTLS; do
		if [ -e "/proc/sys/${s//.//}" ]; then echo "$s=$(sysctl -n "$s")"; fi
	done >"$KUBE_STATE/sysctls.new"
	for p in $HOSTPATHS; do
		[ -e "$p" ] || echo "$p"
	done >"$KUBE_STATE/created"
	mv "$KUBE_STATE/sysctls.new" "$KUBE_STATE/sysctls"
}

network_up() {
	# Forwarding is needed for pod -> Service -> pod (DNAT on the node); the guard chains
	# below keep it to the cluster's own ranges. bridge-nf-call-iptables makes bridged
	# pod-to-pod replies pass conntrack, so Service NAT is undone on the way back.
	sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
	if ! ip link show "$KUBE_BRIDGE" >/dev/null 2>&1; then
		ip link add "$KUBE_BRIDGE" type bridge
		log "created bridge $KUBE_BRIDGE"
	fi
	ip addr replace "$KUBE_NODE_IP/${KUBE_POD_CIDR#*/}" dev "$KUBE_BRIDGE"
	ip link set "$KUBE_BRIDGE" up
	guards_up
}

# Our own chains, jumped to from INPUT and FORWARD; global policies are left as they are.
guards_up() {
	local ipt="iptables -w"
	$ipt -N DBCLOUD-KUBE-FWD 2>/dev/null || $ipt -F DBCLOUD-KUBE-FWD
	$ipt -A DBCLOUD-KUBE-FWD -i "$KUBE_BRIDGE" -o "$KUBE_BRIDGE" -s "$KUBE_POD_CIDR" -d "$KUBE_POD_CIDR" -j ACCEPT
	$ipt -A DBCLOUD-KUBE-FWD -i "$KUBE_BRIDGE" -j DROP
	$ipt -A DBCLOUD-KUBE-FWD -o "$KUBE_BRIDGE" -j DROP
	$ipt -C FORWARD -j DBCLOUD-KUBE-FWD 2>/dev/null || $ipt -I FORWARD 1 -j DBCLOUD-KUBE-FWD
	# From pods to the node: replies, the apiserver (the kubernetes Service's endpoint) and
	# DNS; nothing else of the host (its other servers may listen on all addresses).
	$ipt -N DBCLOUD-KUBE-IN 2>/dev/null || $ipt -F DBCLOUD-KUBE-IN
	$ipt -A DBCLOUD-KUBE-IN -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
	$ipt -A DBCLOUD-KUBE-IN -d "$KUBE_NODE_IP" -p tcp --dport "$KUBE_APISERVER_PORT" -j ACCEPT
	$ipt -A DBCLOUD-KUBE-IN -d "$KUBE_NODE_IP" -p udp --dport 53 -j ACCEPT
	$ipt -A DBCLOUD-KUBE-IN -d "$KUBE_NODE_IP" -p tcp --dport 53 -j ACCEPT
	$ipt -A DBCLOUD-KUBE-IN -j DROP
	$ipt -C INPUT -i "$KUBE_BRIDGE" -j DBCLOUD-KUBE-IN 2>/dev/null || $ipt -I INPUT 1 -i "$KUBE_BRIDGE" -j DBCLOUD-KUBE-IN
}

# ---------------------------------------------------------------------------------------
# Certificates and kubeconfigs (openssl; one CA for the cluster, made once per `up`).

cert() { # NAME CN O SAN(or "") USAGE(client|server|both)
	local name=$1 cn=$2 o=$3 san=$4 use=$5 ext="$PKI/$1.ext" subj
	[ -f "$PKI/$name.crt" ] && return 0
	subj="/CN=$cn"
	[ -z "$o" ] || subj="/O=$o$subj"
	openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
	openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		case $use in
		client) echo "extendedKeyUsage=clientAuth" ;;
		server) echo "extendedKeyUsage=serverAuth" ;;
		both) echo "extendedKeyUsage=serverAuth,clientAuth" ;;
		esac
		[ -z "$san" ] || echo "subjectAltName=$san"
	} >"$ext"
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 30 -sha256 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr" "$ext"
}

kubeconfig() { # NAME (cert name) -> $KUBE_STATE/NAME.kubeconfig
	cat >"$KUBE_STATE/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dbcloud-kube
  cluster:
    certificate-authority: $PKI/ca.crt
    server: https://$KUBE_NODE_IP:$KUBE_APISERVER_PORT
users:
- name: $1
  user:
    client-certificate: $PKI/$1.crt
    client-key: $PKI/$1.key
contexts:
- name: dbcloud-kube
  context: {cluster: dbcloud-kube, user: $1}
current-context: dbcloud-kube
EOF
}

pki() {
	mkdir -p "$PKI"
	chmod 700 "$PKI"
	if [ ! -f "$PKI/ca.crt" ]; then
		openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
			-days 30 -subj "/CN=dbcloud-kube-ca" 2>/dev/null
	fi
	[ -f "$PKI/sa.key" ] || { openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null && openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null; }
	cert apiserver kube-apiserver "" "IP:$KUBE_NODE_IP,IP:$KUBE_API_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" server
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" client
	cert kubelet-serving "system:node:$KUBE_NODE_NAME" system:nodes "IP:$KUBE_NODE_IP,DNS:$KUBE_NODE_NAME" server
	cert admin dbcloud-kube-admin system:masters "" client
	cert controller-manager system:kube-controller-manager "" "" client
	cert scheduler system:kube-scheduler "" "" client
	cert kubelet "system:node:$KUBE_NODE_NAME" system:nodes "" client
	cert kube-proxy system:kube-proxy "" "" client
	cert coredns dbcloud:coredns "" "" client
	local k
	for k in admin controller-manager scheduler kubelet kube-proxy coredns; do kubeconfig "$k"; done
}

# ---------------------------------------------------------------------------------------
# Components.

etcd_up() {
	start etcd "$BIN/etcd" --name "$KUBE_NODE_NAME" --data-dir "$KUBE_STATE/etcd" \
		--listen-client-urls "http://127.0.0.1:$KUBE_ETCD_CLIENT_PORT" \
		--advertise-client-urls "http://127.0.0.1:$KUBE_ETCD_CLIENT_PORT" \
		--listen-peer-urls "http://127.0.0.1:$KUBE_ETCD_PEER_PORT" \
		--initial-advertise-peer-urls "http://127.0.0.1:$KUBE_ETCD_PEER_PORT" \
		--initial-cluster "$KUBE_NODE_NAME=http://127.0.0.1:$KUBE_ETCD_PEER_PORT" \
		--listen-metrics-urls "" --log-level warn
	wait_for etcd 60 curl -fsS "http://127.0.0.1:$KUBE_ETCD_CLIENT_PORT/health"
}

apiserver_up() {
	start kube-apiserver "$BIN/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$KUBE_ETCD_CLIENT_PORT" \
		--bind-address "$KUBE_NODE_IP" --advertise-address "$KUBE_NODE_IP" --secure-port "$KUBE_APISERVER_PORT" \
		--service-cluster-ip-range "$KUBE_SERVICE_CIDR" --service-node-port-range "$KUBE_NODE_PORT_RANGE" \
		--client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
		--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
		--allow-privileged=true --profiling=false --v=1
	wait_for kube-apiserver 120 kubectl --kubeconfig "$ADMIN" get --raw /readyz
}

controllers_up() {
	start kube-controller-manager "$BIN/kube-controller-manager" \
		--kubeconfig "$KUBE_STATE/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$KUBE_STATE/controller-manager.kubeconfig" \
		--authorization-kubeconfig "$KUBE_STATE/controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
		--root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
		--cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
		--service-cluster-ip-range "$KUBE_SERVICE_CIDR" --allocate-node-cidrs=false --v=1
	start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$KUBE_STATE/scheduler.kubeconfig" \
		--authentication-kubeconfig "$KUBE_STATE/scheduler.kubeconfig" \
		--authorization-kubeconfig "$KUBE_STATE/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false --v=1
}

containerd_up() {
	local c=$KUBE_STATE/containerd-config.toml reg=$KUBE_STATE/registry h
	mkdir -p "$KUBE_STATE/cni/net.d" "$KUBE_STATE/cni/networks" "$KUBE_RUN"
	# Any registry resolves to a closed loopback port: a missing image fails at once instead
	# of being fetched. `_default` covers names not listed.
	for h in _default docker.io ghcr.io registry.k8s.io quay.io gcr.io; do
		mkdir -p "$reg/$h"
		printf 'server = "http://127.0.0.1:1"\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n' >"$reg/$h/hosts.toml"
	done
	cat >"$c" <<EOF
# containerd for dbcloud's single-node cluster (scripts/kube-node.sh): its own root, state
# and socket, so it is independent of any other containerd on the machine.
version = 2
root = "$KUBE_STATE/containerd"
state = "$KUBE_RUN/containerd"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  # Default /opt/containerd: keep even that inside our state.
  path = "$KUBE_STATE/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$KUBE_IMAGE_PAUSE"
  # root here lacks CAP_SYS_RESOURCE: runc would fail every sandbox writing a lower
  # oom_score_adj than its own.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # No systemd as PID 1: the kubelet uses cgroupfs too.
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$KUBE_STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$reg"
EOF
	# Pods on our bridge, addresses from its range, routes only to the Service range: a pod
	# has no route off the cluster at all (and the guard chains drop it if it had).
	cat >"$KUBE_STATE/cni/net.d/10-dbcloud.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "dbcloud",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$KUBE_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$KUBE_STATE/cni/networks",
        "ranges": [[{"subnet": "$KUBE_POD_CIDR", "gateway": "$KUBE_NODE_IP"}]],
        "routes": [{"dst": "$KUBE_SERVICE_CIDR"}]
      }
    }
  ]
}
EOF
	# The proxy variables are a second net under the registry configuration: containerd
	# makes no other HTTP requests.
	(
		export HTTP_PROXY=http://127.0.0.1:1 HTTPS_PROXY=http://127.0.0.1:1 NO_PROXY=
		start containerd /usr/bin/containerd --config "$c"
	)
	wait_for containerd 60 ctr --address "$SOCK" version
}

images_import() {
	local img path name t
	for img in $IMAGES; do
		path=$("$here/kube-images.sh" "$img")
		name=$(tar -xOf "$path" manifest.json | sed -E 's/.*"RepoTags":\["([^"]+)".*/\1/')
		# Re-import only a changed archive: the imported digest is the archive's config.
		if [ "$(cat "$KUBE_STATE/imported-$img" 2>/dev/null)" = "$path" ] && CTR images ls -q | grep -qxF "$name"; then
			continue
		fi
		t=$(now_ms)
		CTR images import "$path" >/dev/null
		log "imported $name in $(($(now_ms) - t)) ms"
		echo "$path" >"$KUBE_STATE/imported-$img"
	done
}

kubelet_up() {
	local cfg=$KUBE_STATE/kubelet-config.yaml
	# Pods resolve through the cluster's DNS only; this file is what the kubelet would
	# otherwise copy from the host (an outside resolver).
	printf 'nameserver %s\noptions ndots:5\n' "$KUBE_NODE_IP" >"$KUBE_STATE/resolv.conf"
	cat >"$cfg" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $KUBE_NODE_IP
healthzBindAddress: $KUBE_NODE_IP
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
# cgroup v1 for cpu and memory on this kind of machine; 1.34 still runs on it.
failCgroupV1: false
failSwapOn: false
clusterDNS: [$KUBE_NODE_IP]
clusterDomain: cluster.local
resolvConf: $KUBE_STATE/resolv.conf
podLogsDir: $KUBE_STATE/pod-logs
staticPodPath: ""
# Imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# The machine's disk is shared with other work; evict only when it is really full.
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%, nodefs.inodesFree: 2%}
serializeImagePulls: false
maxPods: 110
EOF
	start kubelet "$BIN/kubelet" --config "$cfg" --kubeconfig "$KUBE_STATE/kubelet.kubeconfig" \
		--root-dir "$KUBE_STATE/kubelet" --node-ip "$KUBE_NODE_IP" --hostname-override "$KUBE_NODE_NAME" --v=1
	wait_for "node $KUBE_NODE_NAME Ready" 120 kubectl --kubeconfig "$ADMIN" wait --for=condition=Ready --timeout=1s "node/$KUBE_NODE_NAME"
}

proxy_up() {
	local cfg=$KUBE_STATE/kube-proxy-config.yaml
	cat >"$cfg" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KUBE_STATE/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $KUBE_POD_CIDR
hostnameOverride: $KUBE_NODE_NAME
bindAddress: $KUBE_NODE_IP
healthzBindAddress: $KUBE_NODE_IP:10256
metricsBindAddress: $KUBE_NODE_IP:10249
nodePortAddresses: [$KUBE_NODE_IP/32]
# Leave the host's conntrack settings and route_localnet alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false, masqueradeAll: false}
EOF
	start kube-proxy "$BIN/kube-proxy" --config "$cfg" --v=1
}

coredns_up() {
	mkdir -p "$KUBE_STATE/coredns"
	cat >"$KUBE_STATE/coredns/Corefile" <<EOF
# The cluster's names only: no forward plugin is built in, so other names fail here.
.:53 {
    bind $KUBE_NODE_IP
    ready $KUBE_NODE_IP:8181
    errors
    cache 30
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBE_STATE/coredns.kubeconfig dbcloud-kube
        pods insecure
    }
}
EOF
	kubectl --kubeconfig "$ADMIN" apply -f - >&2 <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "dbcloud:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "dbcloud:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "dbcloud:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "dbcloud:coredns"}
EOF
	start coredns "$DNSBIN/coredns" -conf "$KUBE_STATE/coredns/Corefile"
	wait_for coredns 60 curl -fsS "http://$KUBE_NODE_IP:8181/ready"
}

# Local PersistentVolumes: directories owned by uid 26 (CNPG's postgres), a StorageClass
# without a provisioner, made the default so Clusters without a storage class bind here.
STORAGE_CLASS=dbcloud-local
PV_COUNT=${DBCLOUD_KUBE_PVS:-48}
storage_up() {
	local i dir
	{
		cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $STORAGE_CLASS
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
EOF
		for ((i = 0; i < PV_COUNT; i++)); do
			dir="$KUBE_STATE/pv/pv$i"
			mkdir -p "$dir"
			chown 26:26 "$dir"
			chmod 700 "$dir"
			cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: dbcloud-local-$i
  labels: {dbcloud.io/local-pv: "true"}
spec:
  capacity: {storage: 100Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: $STORAGE_CLASS
  local: {path: $dir}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [$KUBE_NODE_NAME]}
EOF
		done
	} | kubectl --kubeconfig "$ADMIN" apply -f - >/dev/null
}

# recycle_pvs makes released local volumes available again, emptied: with no provisioner,
# a PersistentVolume whose claim was deleted stays Released forever, and the e2e suite creates
# and deletes many services.
recycle_pvs() {
	local pv path
	kubectl --kubeconfig "$ADMIN" get pv -l dbcloud.io/local-pv=true \
		-o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name} {.spec.local.path}{"\n"}{end}' |
		while read -r pv path; do
			[ -n "$pv" ] || continue
			case "$path" in "$KUBE_STATE"/pv/*) ;; *) continue ;; esac
			find "$path" -mindepth 1 -delete
			kubectl --kubeconfig "$ADMIN" patch pv "$pv" --type json -p '[{"op":"remove","path":"/spec/claimRef"}]' >/dev/null
			log "recycled $pv"
		done
}

cnpg_up() {
	local manifest
	manifest=$(go env GOMODCACHE)/github.com/cloudnative-pg/cloudnative-pg@$CNPG_VERSION/releases/cnpg-${CNPG_VERSION#v}.yaml
	[ -f "$manifest" ] || (cd "$repo/tools/cnpg" && go mod download github.com/cloudnative-pg/cloudnative-pg)
	# The operator's defaults for the pods it makes: our PostgreSQL and PgBouncer images. It
	# reads them at start, so they exist before its Deployment does.
	kubectl --kubeconfig "$ADMIN" create namespace cnpg-system >/dev/null 2>&1 || true
	kubectl --kubeconfig "$ADMIN" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ConfigMap
metadata: {name: cnpg-controller-manager-config, namespace: cnpg-system}
data:
  POSTGRES_IMAGE_NAME: $KUBE_IMAGE_POSTGRES
  PGBOUNCER_IMAGE_NAME: $KUBE_IMAGE_PGBOUNCER
EOF
	# The release manifest names CNPG's registry image and pulls it Always: ours is the one
	# built here, and nothing is pulled.
	sed -e "s#ghcr.io/cloudnative-pg/cloudnative-pg:${CNPG_VERSION#v}#$KUBE_IMAGE_OPERATOR#g" \
		-e 's#imagePullPolicy: Always#imagePullPolicy: Never#' "$manifest" |
		kubectl --kubeconfig "$ADMIN" apply --server-side --force-conflicts -f - >/dev/null
	kubectl --kubeconfig "$ADMIN" -n cnpg-system rollout status deployment/cnpg-controller-manager --timeout=300s >&2
}

status() {
	local n ok=0
	for n in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns; do
		if alive "$n"; then
			echo "$n: running (pid $(cat "$PIDS/$n.pid"))" >&2
		else
			echo "$n: not running" >&2
			ok=1
		fi
	done
	if [ "$ok" -eq 0 ] && kubectl --kubeconfig "$ADMIN" wait --for=condition=Ready --timeout=2s "node/$KUBE_NODE_NAME" >/dev/null 2>&1; then
		echo "node $KUBE_NODE_NAME: Ready; kubeconfig $ADMIN" >&2
		return 0
	fi
	return 1
}

# prepare installs the host packages and builds (or finds cached) every binary and image `up`
# needs, and starts nothing: CI runs it beside the Go tests, at low priority.
prepare() {
	local t0
	[ "$(id -u)" -eq 0 ] || die "run as root"
	t0=$(now_ms)
	host_packages
	BIN=$("$here/kube-build.sh" kube-node)
	DNSBIN=$("$here/kube-build.sh" coredns)
	for i in $IMAGES; do "$here/kube-images.sh" "$i" >/dev/null; done
	log "binaries and images ready in $((($(now_ms) - t0) / 1000)) s"
}

up() {
	local t0 t t1
	t0=$(now_ms)
	prepare
	export PATH="$BIN:$PATH" # kubectl
	t=$(now_ms)
	mkdir -p "$KUBE_STATE" "$KUBE_RUN"
	# `down` and `status` use the binaries this `up` ran, even after the pins change.
	echo "$BIN" >"$KUBE_STATE/bin"
	record_host
	network_up
	pki
	etcd_up
	apiserver_up
	log "apiserver ready $((($(now_ms) - t) / 1000)) s after start"
	controllers_up
	containerd_up
	t1=$(now_ms)
	images_import
	log "images imported in $((($(now_ms) - t1) / 1000)) s"
	kubelet_up
	proxy_up
	coredns_up
	storage_up
	recycle_pvs
	cnpg_up
	t1=$(now_ms)
	backups_up
	log "object store and barman-cloud plugin ready in $((($(now_ms) - t1) / 1000)) s"
	log "cluster up in $((($(now_ms) - t) / 1000)) s (whole run $((($(now_ms) - t0) / 1000)) s)"
	echo "$ADMIN"
}

# ---------------------------------------------------------------------------------------
# Teardown.

pods_down() {
	alive containerd || return 0
	local id
	# Every container and sandbox of the cluster, through containerd (never by pid guess):
	# tasks killed and deleted, then the containers, so no shim is left behind.
	for id in $(CTR tasks ls -q 2>/dev/null); do
		CTR tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
	done
	for id in $(CTR tasks ls -q 2>/dev/null); do
		CTR tasks delete -f "$id" >/dev/null 2>&1 || true
	done
	for id in $(CTR containers ls -q 2>/dev/null); do
		CTR containers delete "$id" >/dev/null 2>&1 || true
	done
}

# shims_down stops shims that outlived their tasks, by the pid files containerd wrote for them.
shims_down() {
	local f pid
	for f in "$KUBE_RUN"/containerd/io.containerd.runtime.v2.task/*/*/shim.pid; do
		[ -f "$f" ] || continue
		pid=$(cat "$f")
		case "$(readlink "/proc/$pid/exe" 2>/dev/null)" in
		*containerd-shim*)
			if kill -KILL "$pid" 2>/dev/null; then log "stopped a leftover shim (pid $pid)"; fi
			;;
		esac
	done
}

unmount_under() { # PREFIX: every mount below it, deepest first
	local m
	awk -v p="$1" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
	done
}

cgroups_down() {
	# The kubelet's pod cgroups (cgroupfs driver), deepest first; only the kubepods tree.
	local c
	for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
		[ -d "$c" ] || continue
		find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
	done
}

down() {
	[ "$(id -u)" -eq 0 ] || die "run as root"
	local BIN s p
	BIN=$(cat "$KUBE_STATE/bin" 2>/dev/null || true)
	# The kubelet first, so it restarts nothing; then the pods; then the rest. The
	# apiserver stops before etcd (the other way round it hangs until SIGKILL).
	stop kubelet
	pods_down
	stop containerd
	shims_down
	stop coredns
	stop kube-proxy
	stop kube-scheduler
	stop kube-controller-manager
	stop kube-apiserver
	stop etcd
	# Leftover shims would hold mounts: none should remain once their tasks were deleted.
	if [ -n "$BIN" ] && [ -x "$BIN/kube-proxy" ]; then
		"$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
	fi
	iptables_down
	if ip link show "$KUBE_BRIDGE" >/dev/null 2>&1; then
		ip link del "$KUBE_BRIDGE"
		log "removed bridge $KUBE_BRIDGE"
	fi
	unmount_under "$KUBE_RUN/"
	unmount_under "$KUBE_STATE/"
	for p in /run/netns/cni-*; do
		[ -e "$p" ] || continue
		umount "$p" 2>/dev/null || true
		rm -f "$p"
	done
	cgroups_down
	if [ -f "$KUBE_STATE/sysctls" ]; then
		while IFS== read -r s v; do
			[ "$(sysctl -n "$s" 2>/dev/null)" = "$v" ] || { sysctl -qw "$s=$v" && log "restored $s=$v"; }
		done <"$KUBE_STATE/sysctls"
	fi
	if [ -f "$KUBE_STATE/created" ]; then
		while read -r p; do
			if [ -n "$p" ] && [ -e "$p" ]; then
				rm -rf "$p"
				log "removed $p"
			fi
		done <"$KUBE_STATE/created"
	fi
	rm -rf "$KUBE_RUN" "$KUBE_STATE"
	log "down: nothing of the cluster is left"
}

iptables_down() {
	local ipt chain table rule
	ipt="iptables -w"
	while $ipt -D FORWARD -j DBCLOUD-KUBE-FWD 2>/dev/null; do :; done
	while $ipt -D INPUT -i "$KUBE_BRIDGE" -j DBCLOUD-KUBE-IN 2>/dev/null; do :; done
	for chain in DBCLOUD-KUBE-FWD DBCLOUD-KUBE-IN; do
		$ipt -F "$chain" 2>/dev/null && $ipt -X "$chain" 2>/dev/null || true
	done
	# What kube-proxy --cleanup and the kubelet leave: the KUBE-* chains and the jumps to them,
	# for both families (the kubelet's canary chains are made for IPv6 too).
	for ipt in "iptables -w" "ip6tables -w"; do
	for table in filter nat mangle; do
		$ipt -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z-]+ .*-j KUBE-' | grep -vE '^-A KUBE-' |
			while read -r rule; do
				# shellcheck disable=SC2086 # the rule's words are iptables arguments
				eval "$ipt -t $table ${rule/-A/-D}" 2>/dev/null || true
			done || true
		for chain in $($ipt -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ { print $2 }'); do
			$ipt -t "$table" -F "$chain" 2>/dev/null || true
		done
		for chain in $($ipt -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ { print $2 }'); do
			$ipt -t "$table" -X "$chain" 2>/dev/null || true
		done
	done
	done
}

case "${1:-}" in
up)
	if [ -f "$KUBE_STATE/bin" ] && PATH="$(cat "$KUBE_STATE/bin"):$PATH" status 2>/dev/null; then
		export PATH="$(cat "$KUBE_STATE/bin"):$PATH"
		recycle_pvs
		echo "$ADMIN"
		exit 0
	fi
	up
	;;
prepare) prepare ;;
down) down ;;
status)
	[ ! -f "$KUBE_STATE/bin" ] || export PATH="$(cat "$KUBE_STATE/bin"):$PATH"
	status
	;;
*)
	echo "usage: kube-node.sh up|prepare|down|status" >&2
	exit 2
	;;
esac
