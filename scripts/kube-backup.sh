# Backups and WAL archives on the single-node cluster: sourced by scripts/kube-node.sh (it
# defines log, die, wait_for, kubectl on PATH, $ADMIN, $PKI, $KUBE_STATE), which calls
#
#   backups_up       both of these, the two servers starting side by side:
#   objectstore_up   MinIO (scripts/kube-images.sh minio) as a Deployment and Service in
#                    namespace $KUBE_OBJSTORE_NS, its data in $KUBE_STATE/objectstore on the
#                    node, its credentials made at `up` (never a fixed password), the bucket made
#                    through its S3 API; and the template ObjectStore $KUBE_OBJSTORE_TEMPLATE with
#                    its credentials Secret beside it, for dbcloud to copy into each project's
#                    namespace (each archives under s3://$KUBE_OBJSTORE_BUCKET/<namespace>)
#   barman_plugin_apply  the barman-cloud plugin: its ObjectStore CRD (from the module's own
#                    config), RBAC, TLS between CNPG and the plugin (openssl, in place of the
#                    cert-manager Certificates of the plugin's manifest), its operator Deployment
#                    and the Service through which CNPG finds it (cnpg.io/pluginName label)
#
# Everything stays inside the cluster: the object store is a ClusterIP Service, and the only
# client outside a pod is `up` itself, creating the bucket from the node.

# The MinIO server listens on one port (S3); its web console is switched off.
OBJSTORE_PORT=9000
OBJSTORE_URL=http://$KUBE_OBJSTORE_SVC.$KUBE_OBJSTORE_NS.svc.cluster.local:$OBJSTORE_PORT
PLUGIN_PORT=9090

# kube ARGS... is kubectl as the cluster's admin.
kube() { kubectl --kubeconfig "$ADMIN" "$@"; }

# objstore_secret prints, once made, the Secret holding the object store's credentials as
# "ACCESS_KEY SECRET_KEY"; it makes them on the first `up` of a cluster, random, so no
# password is ever written in the repository, and reuses them on a later `up`.
objstore_secret() {
	local id key
	if ! kube -n "$KUBE_OBJSTORE_NS" get secret "$KUBE_OBJSTORE_SECRET" >/dev/null 2>&1; then
		id="dbcloud$(openssl rand -hex 6)"
		key=$(openssl rand -hex 24)
		# Through stdin: a password on kubectl's command line would show in the process list.
		kube apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Secret
metadata: {name: $KUBE_OBJSTORE_SECRET, namespace: $KUBE_OBJSTORE_NS}
type: Opaque
stringData: {ACCESS_KEY_ID: "$id", ACCESS_SECRET_KEY: "$key"}
EOF
		log "object store credentials made (Secret $KUBE_OBJSTORE_NS/$KUBE_OBJSTORE_SECRET)"
	fi
	id=$(kube -n "$KUBE_OBJSTORE_NS" get secret "$KUBE_OBJSTORE_SECRET" -o jsonpath='{.data.ACCESS_KEY_ID}' | base64 -d)
	key=$(kube -n "$KUBE_OBJSTORE_NS" get secret "$KUBE_OBJSTORE_SECRET" -o jsonpath='{.data.ACCESS_SECRET_KEY}' | base64 -d)
	echo "$id $key"
}

objectstore_up() {
	local data=$KUBE_STATE/objectstore creds ip
	kube create namespace "$KUBE_OBJSTORE_NS" >/dev/null 2>&1 || true
	creds=$(objstore_secret)
	# errexit does not reach into a command substitution: a failed Secret would show only as
	# a pod that never starts.
	[[ $creds =~ ^[^\ ]+\ [^\ ]+$ ]] || die "object store credentials: cannot read Secret $KUBE_OBJSTORE_NS/$KUBE_OBJSTORE_SECRET"
	# The data on the node, owned by the server's user; `down` removes $KUBE_STATE.
	mkdir -p "$data"
	chown 65532:65532 "$data"
	chmod 700 "$data"
	kube apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: $KUBE_OBJSTORE_SVC, namespace: $KUBE_OBJSTORE_NS}
spec:
  replicas: 1
  # One server on one directory: never two at once.
  strategy: {type: Recreate}
  selector: {matchLabels: {app: $KUBE_OBJSTORE_SVC}}
  template:
    metadata: {labels: {app: $KUBE_OBJSTORE_SVC}}
    spec:
      automountServiceAccountToken: false
      enableServiceLinks: false
      securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: minio
        image: $KUBE_IMAGE_MINIO
        imagePullPolicy: Never
        args: [server, /data, --address, ":$OBJSTORE_PORT", --certs-dir, /tmp/certs]
        env:
        - {name: HOME, value: /tmp}
        - {name: MINIO_BROWSER, value: "off"}
        - {name: MINIO_UPDATE, value: "off"}
        - name: MINIO_ROOT_USER
          valueFrom: {secretKeyRef: {name: $KUBE_OBJSTORE_SECRET, key: ACCESS_KEY_ID}}
        - name: MINIO_ROOT_PASSWORD
          valueFrom: {secretKeyRef: {name: $KUBE_OBJSTORE_SECRET, key: ACCESS_SECRET_KEY}}
        ports: [{containerPort: $OBJSTORE_PORT}]
        readinessProbe:
          httpGet: {path: /minio/health/ready, port: $OBJSTORE_PORT}
          periodSeconds: 2
        resources:
          requests: {cpu: 50m, memory: 128Mi}
          limits: {memory: 1Gi}
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
        volumeMounts:
        - {name: data, mountPath: /data}
        - {name: tmp, mountPath: /tmp}
      volumes:
      - {name: data, hostPath: {path: $data, type: Directory}}
      - {name: tmp, emptyDir: {}}
---
apiVersion: v1
kind: Service
metadata: {name: $KUBE_OBJSTORE_SVC, namespace: $KUBE_OBJSTORE_NS}
spec:
  selector: {app: $KUBE_OBJSTORE_SVC}
  ports: [{name: s3, port: $OBJSTORE_PORT, targetPort: $OBJSTORE_PORT}]
EOF
	kube -n "$KUBE_OBJSTORE_NS" rollout status "deployment/$KUBE_OBJSTORE_SVC" --timeout=300s >&2
	ip=$(kube -n "$KUBE_OBJSTORE_NS" get service "$KUBE_OBJSTORE_SVC" -o jsonpath='{.spec.clusterIP}')
	objstore_bucket "$ip" "$creds"
	objstore_template
}

# objstore_bucket IP "ACCESS SECRET" makes the bucket unless it exists: barman-cloud does not
# create it. curl signs with AWS SigV4; its credentials come from stdin, not its arguments.
objstore_bucket() {
	local url="http://$1:$OBJSTORE_PORT/$KUBE_OBJSTORE_BUCKET" code
	# Ready pod, yet the Service's rules may lag behind it in kube-proxy.
	wait_for "object store through its Service" 60 curl -fsS -o /dev/null "http://$1:$OBJSTORE_PORT/minio/health/ready"
	s3() { # CURL_METHOD_ARGS "ACCESS SECRET": prints the HTTP status
		curl -sS -o /dev/null -w '%{http_code}' $1 --aws-sigv4 aws:amz:us-east-1:s3 -K - "$url" <<<"user = \"${2/ /:}\""
	}
	code=$(s3 --head "$2")
	if [ "$code" = 200 ]; then return 0; fi
	code=$(s3 "-X PUT" "$2")
	[ "$code" = 200 ] || die "object store: creating bucket $KUBE_OBJSTORE_BUCKET answered HTTP $code"
	log "object store: bucket $KUBE_OBJSTORE_BUCKET made"
}

# objstore_template writes the ObjectStore dbcloud copies into each project's namespace (with
# destinationPath s3://$KUBE_OBJSTORE_BUCKET/<namespace>) together with the Secret it names.
# Here it points at the bucket's root; it is a template and no Cluster uses it.
objstore_template() {
	kube apply -f - >/dev/null <<EOF
apiVersion: barmancloud.cnpg.io/v1
kind: ObjectStore
metadata: {name: $KUBE_OBJSTORE_TEMPLATE, namespace: $KUBE_OBJSTORE_NS}
spec:
  configuration:
    destinationPath: s3://$KUBE_OBJSTORE_BUCKET/
    endpointURL: $OBJSTORE_URL
    s3Credentials:
      accessKeyId: {name: $KUBE_OBJSTORE_SECRET, key: ACCESS_KEY_ID}
      secretAccessKey: {name: $KUBE_OBJSTORE_SECRET, key: ACCESS_SECRET_KEY}
    wal: {compression: gzip, maxParallel: 2}
    data: {compression: gzip, jobs: 1}
EOF
}

# plugin_certs makes the plugin's two self-signed certificates, as the plugin's manifest has
# cert-manager do: CNPG trusts the server certificate itself (the Secret's tls.crt) and checks
# the name of the Service, and the plugin trusts CNPG's client certificate itself.
plugin_certs() {
	local name
	selfsigned() { # NAME CN EXTENSION...
		local name=$1 cn=$2 ext=() e
		shift 2
		# Kept across `up`s while valid for another day; a cluster kept up longer gets new ones.
		openssl x509 -checkend 86400 -noout -in "$PKI/barman-cloud-$name.crt" >/dev/null 2>&1 && return 0
		for e in "keyUsage=critical,digitalSignature,keyEncipherment" "$@"; do ext+=(-addext "$e"); done
		openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=$cn" "${ext[@]}" \
			-keyout "$PKI/barman-cloud-$name.key" -out "$PKI/barman-cloud-$name.crt" 2>/dev/null
	}
	selfsigned server barman-cloud subjectAltName=DNS:barman-cloud extendedKeyUsage=serverAuth
	selfsigned client barman-cloud-client extendedKeyUsage=clientAuth
	for name in server client; do
		kube -n cnpg-system create secret tls "barman-cloud-$name-tls" --cert "$PKI/barman-cloud-$name.crt" \
			--key "$PKI/barman-cloud-$name.key" --dry-run=client -o yaml | kube apply -f - >/dev/null
	done
}

backups_up() {
	# The CRD first: the template ObjectStore needs it.
	barman_plugin_apply
	objectstore_up
	kube -n cnpg-system rollout status deployment/barman-cloud --timeout=300s >&2
}

barman_plugin_apply() {
	local dir
	dir=$(cd / && GOFLAGS=-mod=mod go mod download -json "github.com/cloudnative-pg/plugin-barman-cloud@$BARMAN_PLUGIN_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	kube apply --server-side --force-conflicts -f "$dir/config/crd/bases/barmancloud.cnpg.io_objectstores.yaml" >/dev/null
	plugin_certs
	kube apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: barman-cloud, namespace: cnpg-system}
---
# What the plugin does: it reads ObjectStores and their Secrets, writes their status, follows
# Backups, and gives each Cluster's service account a Role to read its ObjectStores and
# Secrets (so it must hold those rights itself).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "dbcloud:barman-cloud"}
rules:
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, delete, get, list, watch]
- apiGroups: [barmancloud.cnpg.io]
  resources: [objectstores]
  verbs: [create, delete, get, list, patch, update, watch]
- apiGroups: [barmancloud.cnpg.io]
  resources: [objectstores/finalizers]
  verbs: [update]
- apiGroups: [barmancloud.cnpg.io]
  resources: [objectstores/status]
  verbs: [get, patch, update]
- apiGroups: [postgresql.cnpg.io]
  resources: [backups]
  verbs: [get, list, watch]
- apiGroups: [postgresql.cnpg.io]
  resources: [clusters/finalizers]
  verbs: [update]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, get, list, patch, update, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "dbcloud:barman-cloud"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "dbcloud:barman-cloud"}
subjects:
- {kind: ServiceAccount, name: barman-cloud, namespace: cnpg-system}
---
# One replica, so no leader election (and no lease rights); the metrics endpoint stays off.
apiVersion: apps/v1
kind: Deployment
metadata: {name: barman-cloud, namespace: cnpg-system}
spec:
  replicas: 1
  strategy: {type: Recreate}
  selector: {matchLabels: {app: barman-cloud}}
  template:
    metadata: {labels: {app: barman-cloud}}
    spec:
      serviceAccountName: barman-cloud
      securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: barman-cloud
        image: $KUBE_IMAGE_BARMAN_PLUGIN
        imagePullPolicy: Never
        args: [operator, --server-cert=/server/tls.crt, --server-key=/server/tls.key,
          --client-cert=/client/tls.crt, "--server-address=:$PLUGIN_PORT", --log-level=info]
        # The container the plugin adds to each instance pod; pulled never (the Cluster's
        # imagePullPolicy is the sidecar's), so it is imported with the others.
        env: [{name: SIDECAR_IMAGE, value: "$KUBE_IMAGE_BARMAN_SIDECAR"}]
        ports: [{containerPort: $PLUGIN_PORT}]
        readinessProbe:
          tcpSocket: {port: $PLUGIN_PORT}
          periodSeconds: 2
        resources:
          requests: {cpu: 20m, memory: 64Mi}
          limits: {memory: 256Mi}
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
        volumeMounts:
        - {name: server, mountPath: /server}
        - {name: client, mountPath: /client}
      volumes:
      - {name: server, secret: {secretName: barman-cloud-server-tls}}
      - {name: client, secret: {secretName: barman-cloud-client-tls}}
---
# CNPG finds plugins by this label on Services of its own namespace, and dials
# <service>:<pluginPort> with the two Secrets the annotations name.
apiVersion: v1
kind: Service
metadata:
  name: barman-cloud
  namespace: cnpg-system
  labels: {app: barman-cloud, cnpg.io/pluginName: $KUBE_BARMAN_PLUGIN_NAME}
  annotations:
    cnpg.io/pluginClientSecret: barman-cloud-client-tls
    cnpg.io/pluginServerSecret: barman-cloud-server-tls
    cnpg.io/pluginPort: "$PLUGIN_PORT"
spec:
  selector: {app: barman-cloud}
  ports: [{port: $PLUGIN_PORT, targetPort: $PLUGIN_PORT}]
EOF
}
