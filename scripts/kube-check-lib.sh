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
