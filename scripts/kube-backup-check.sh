#!/usr/bin/env bash
# Proves backups and WAL archiving on the running single-node cluster (scripts/kube-node.sh up,
# scripts/kube-backup.sh) and measures them (docs/kubernetes.md, "Backups and forks"):
#
#   1. a project namespace gets its ObjectStore the way dbcloud makes it: the template
#      ObjectStore and its Secret copied from $KUBE_OBJSTORE_NS, destinationPath
#      s3://$KUBE_OBJSTORE_BUCKET/<namespace>;
#   2. a one-instance Cluster with the barman-cloud plugin as its WAL archiver becomes healthy
#      and reports ContinuousArchiving True (timed);
#   3. a plugin Backup of it completes (timed);
#   4. a Cluster recovered from that Backup is healthy with the backed-up rows (timed);
#   5. a Cluster recovered from the archive up to a time (PITR) is healthy with the rows
#      written before that time and without the one written after (timed).
#
# Each wait polls with a deadline. Run as root with the cluster up; prints one "measure: ..."
# line per number. Called by scripts/kube-node-check.sh; also runs alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=kube-node.env
. "$here/kube-node.env"
CHECK="kube backup check"
# shellcheck source=kube-check-lib.sh
. "$here/kube-check-lib.sh"

kc=$("$here/kube-node.sh" up)
export PATH="$(cat "$KUBE_STATE/bin"):$PATH"
# A namespace of its own each run: its archive path in the bucket must be empty.
ns=dbcloud-backup-check-$(date +%s)
k() { kubectl --kubeconfig "$kc" -n "$ns" "$@"; }
kubectl --kubeconfig "$kc" create namespace "$ns" >/dev/null
# Its clusters hold CPU the e2e run after it needs on a 2-core node: gone however this ends.
trap 'kubectl --kubeconfig "$kc" delete namespace "$ns" --wait=false >/dev/null 2>&1 || true' EXIT

# 1. The template, copied as dbcloud's runtime copies it.
tk() { kubectl --kubeconfig "$kc" -n "$KUBE_OBJSTORE_NS" "$@"; }
printf '{"apiVersion":"v1","kind":"Secret","metadata":{"name":"%s","namespace":"%s"},"type":"Opaque","data":%s}' \
	"$KUBE_OBJSTORE_SECRET" "$ns" "$(tk get secret "$KUBE_OBJSTORE_SECRET" -o jsonpath='{.data}')" | k apply -f - >/dev/null
printf '{"apiVersion":"barmancloud.cnpg.io/v1","kind":"ObjectStore","metadata":{"name":"store","namespace":"%s"},"spec":%s}' \
	"$ns" "$(tk get objectstore "$KUBE_OBJSTORE_TEMPLATE" -o jsonpath='{.spec}')" | k apply -f - >/dev/null
k patch objectstore store --type merge \
	-p "{\"spec\":{\"configuration\":{\"destinationPath\":\"s3://$KUBE_OBJSTORE_BUCKET/$ns\"}}}" >/dev/null

# cluster NAME BOOTSTRAP_AND_MORE_YAML creates a one-instance Cluster of our 17 image.
cluster() { small_cluster "$1" "$ns" "$KUBE_IMAGE_POSTGRES17" "$2" | k apply -f - >/dev/null; }
healthy() { # NAME
	local phase ready
	IFS='|' read -r phase ready <<<"$(k get cluster "$1" -o jsonpath='{.status.phase}|{.status.readyInstances}')"
	[ "$phase" = "Cluster in healthy state" ] && [ "$ready" = 1 ]
}
# sql NAME SQL runs SQL in database app on NAME's primary, as postgres over the pod's socket.
sql() {
	local pod
	pod=$(k get cluster "$1" -o jsonpath='{.status.currentPrimary}')
	k exec "$pod" -c postgres -- psql -h /controller/run -U postgres -d app -Atqc "$2"
}
archiving() {
	[ "$(k get cluster origin -o jsonpath='{.status.conditions[?(@.type=="ContinuousArchiving")].status}')" = True ]
}

# 2. The archiver.
t=$(now_ms)
cluster origin "  plugins:
  - name: $KUBE_BARMAN_PLUGIN_NAME
    isWALArchiver: true
    parameters: {barmanObjectName: store}"
poll "origin healthy" 600 healthy origin
measure "one-instance Cluster with the WAL archiver created to healthy: $(secs "$t" "$(now_ms)") s"
sql origin "SELECT pg_switch_wal()" >/dev/null
poll "origin ContinuousArchiving True" 300 archiving
measure "created to ContinuousArchiving True: $(secs "$t" "$(now_ms)") s"
sql origin "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('in backup')"

# 3. A base backup through the plugin.
t=$(now_ms)
k apply -f - >/dev/null <<EOF
apiVersion: postgresql.cnpg.io/v1
kind: Backup
metadata: {name: origin-1}
spec:
  cluster: {name: origin}
  method: plugin
  pluginConfiguration: {name: $KUBE_BARMAN_PLUGIN_NAME}
EOF
completed() {
	local phase
	phase=$(k get backup origin-1 -o jsonpath='{.status.phase}')
	[ "$phase" != failed ] || die "backup failed: $(k get backup origin-1 -o jsonpath='{.status.error}')"
	[ "$phase" = completed ]
}
poll "backup completed" 600 completed
measure "plugin Backup created to completed: $(secs "$t" "$(now_ms)") s"

# Rows after the backup: one before the recovery target time, one after; the WAL switched so
# both are in the archive.
# Each statement is its own transaction, so the target (read after the first commit) lies
# strictly between the two commits.
sql origin "INSERT INTO kept VALUES ('before target')"
# The form dbcloud's runtime writes; PostgreSQL refuses a trailing Z in recovery_target_time.
target=$(sql origin "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00:00'")
sql origin "INSERT INTO kept VALUES ('after target')"
# The segment holding the last row, closed by a switch (a second switch of an empty segment
# would do nothing).
last=$(sql origin "SELECT pg_walfile_name(pg_current_wal_lsn())")
sql origin "SELECT pg_switch_wal()" >/dev/null
archived() { # the segment holding the last row is in the archive
	local got
	got=$(sql origin "SELECT last_archived_wal FROM pg_stat_archiver")
	[ -n "$got" ] && [[ "$got" > "$last" || "$got" == "$last" ]]
}
poll "WAL archived past the last row" 300 archived

# 4. Recovery from the Backup. CNPG restores through a plugin only from an external cluster
# (bootstrap.recovery.backup is its in-tree barman's path), so the Backup is named by the
# backup ID it recorded, and targetImmediate stops at its end: exactly what it holds.
backup_id=$(k get backup origin-1 -o jsonpath='{.status.backupId}')
[ -n "$backup_id" ] || die "backup origin-1 has no status.backupId"
source_origin="  externalClusters:
  - name: origin
    plugin:
      name: $KUBE_BARMAN_PLUGIN_NAME
      parameters: {barmanObjectName: store, serverName: origin}"
t=$(now_ms)
cluster from-backup "  bootstrap:
    recovery:
      source: origin
      recoveryTarget: {backupID: $backup_id, targetImmediate: true}
$source_origin"
poll "cluster recovered from the backup healthy" 900 healthy from-backup
measure "Cluster recovered from the Backup, created to healthy: $(secs "$t" "$(now_ms)") s"
got=$(sql from-backup "SELECT string_agg(v, ',' ORDER BY v) FROM kept")
[ "$got" = "in backup" ] || die "recovered from the backup $backup_id: rows [$got], want [in backup]"
log "recovered from the Backup $backup_id: rows [$got]"

# 5. Point in time, from the archive.
t=$(now_ms)
cluster pitr "  bootstrap:
    recovery:
      source: origin
      recoveryTarget: {targetTime: \"$target\"}
$source_origin"
poll "cluster recovered to a point in time healthy" 900 healthy pitr
measure "Cluster recovered to a point in time from the archive, created to healthy: $(secs "$t" "$(now_ms)") s"
got=$(sql pitr "SELECT string_agg(v, ',' ORDER BY v) FROM kept")
[ "$got" = "before target,in backup" ] || die "recovered to $target: rows [$got], want [before target,in backup]"
log "recovered to $target: rows [$got]"

delete_namespace "$kc" "$ns" 300
log "backups: archive, plugin Backup, recovery from it and PITR from the archive all checked"
