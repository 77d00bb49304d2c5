#!/bin/sh
# The long chaos run (docs/chaos.md, TestChaos_Long): ROUNDS rounds on two
# control planes on a PostgreSQL store, with disk-full and quota moments,
# then bench/chaos.md with the seed, the rounds run, the duration and the
# violations. The run's whole log goes to bench/out/ (not kept in git).
#
#   bench/chaos-long.sh [ROUNDS [SEED [FOR]]]   (from the module root, as
#       root; default 1000 rounds, a new seed; FOR, such as 30m, starts no
#       round after that long: the rounds run are what bench/chaos.md says)
# Replay a run with its seed and rounds. Stops at the first round whose
# invariants do not hold (later rounds would start from a broken state).
set -eu
rounds=${1:-1000}
seed=${2:-0}
budget=${3:-0}
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench' || echo ' (with uncommitted changes)')
mkdir -p bench/out
log=bench/out/chaos-long-$(date -u +%Y%m%dT%H%M%SZ).log
began=$(date -u '+%Y-%m-%d %H:%M UTC')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(date +%s)
set +e
go test -count=1 -v -timeout 0 -run '^TestChaos_Long$' ./e2e \
	-chaos.long.rounds="$rounds" -chaos.seed="$seed" -chaos.for="$budget" >"$log" 2>&1
rc=$?
set -e
secs=$(($(date +%s) - t0))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
# The test's own summary line: "chaos: seed N: R rounds, ..., V violations, D".
summary=$(grep -o 'chaos: seed [0-9]*: .*' "$log" | tail -n 1 || true)
seed_used=$(grep -o 'chaos: seed [0-9]*' "$log" | head -n 1 | grep -o '[0-9]*$' || echo "?")
rounds_run=$(printf '%s' "$summary" | sed -n 's/^chaos: seed [0-9]*: \([0-9]*\) rounds.*/\1/p')
violations=$(grep -c '^ *chaos_test.go:[0-9]*: violation: ' "$log" || true)
disk=$(grep -c 'round [0-9]*: .*the disk full at' "$log" || true)
quota=$(grep -c 'round [0-9]*: .*a tenant writes past its limit from' "$log" || true)
verdict=PASS
[ "$rc" -eq 0 ] || verdict="FAIL (go test exit $rc)"
{
	echo "# Long chaos run"
	echo
	echo "\`bench/chaos-long.sh $rounds $seed_used\` (TestChaos_Long: two control planes on a PostgreSQL store,"
	echo "one killed each round, a postmaster in one round of two, disk-full and quota moments; docs/chaos.md)."
	echo "Written by the script; the run's log was $log."
	echo
	echo "| | |"
	echo "|---|---|"
	echo "| began | $began |"
	echo "| commit | $commit |"
	echo "| seed | $seed_used |"
	echo "| rounds asked | $rounds$([ "$budget" = 0 ] || echo ", starting none after $budget") |"
	echo "| rounds run | ${rounds_run:-?} |"
	echo "| rounds with a disk-full moment | $disk |"
	echo "| rounds with a quota moment | $quota |"
	echo "| duration | $((secs / 60)) min $((secs % 60)) s |"
	echo "| violations | $violations |"
	echo "| result | $verdict |"
	echo "| load average before, after | $load_before; $load_after |"
	echo
	echo "Summary: ${summary:-none (the test did not finish; see the log)}"
	if [ "$violations" -gt 0 ]; then
		echo
		echo "Violations:"
		echo
		grep '^ *chaos_test.go:[0-9]*: violation: ' "$log" | sed 's/^ *chaos_test.go:[0-9]*: /- /'
	fi
} >bench/chaos.md
cat bench/chaos.md
exit "$rc"
