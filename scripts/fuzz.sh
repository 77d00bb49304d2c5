#!/usr/bin/env bash
# Runs every fuzz target of the module for SECONDS each (default 60) and
# keeps the inputs each run found interesting (new coverage) in the
# repository's corpus, PKG/testdata/fuzz/TARGET/, beside the seeds that
# plain `go test` already runs in CI. Go keeps those inputs in its cache
# ($(go env GOCACHE)/fuzz/...), outside the repository and shared by every
# checkout of the module, so only the files this run added are copied.
# A failing input is written to the corpus by go itself; the script goes
# on with the other targets and exits 1 at the end.
#
#   scripts/fuzz.sh [SECONDS]      (from anywhere in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
seconds=${1:-60}
cache=$(go env GOCACHE)/fuzz
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
summary=()

# "IMPORT_PATH DIR TARGET" for every fuzz target.
targets=$(go list -f '{{.ImportPath}} {{.Dir}}' ./... | while read -r pkg dir; do
	go test -list '^Fuzz' "$pkg" | grep '^Fuzz' | sed "s|^|$pkg $dir |" || true
done)

while read -r pkg dir target; do
	[ -n "$target" ] || continue
	from="$cache/$pkg/$target"
	to="$dir/testdata/fuzz/$target"
	mkdir -p "$from" "$to"
	before=$(ls "$from")
	echo "== $target ($pkg) for ${seconds}s"
	result=ok
	if ! go test -run '^$' -fuzz "^$target\$" -fuzztime "${seconds}s" "$pkg" 2>&1 | tee "$log"; then
		result=FAILED
		status=1
	fi
	kept=0
	for f in "$from"/*; do
		name=$(basename "$f")
		[ -e "$f" ] || continue
		if ! grep -qxF "$name" <<<"$before" && [ ! -e "$to/$name" ]; then
			cp "$f" "$to/$name"
			kept=$((kept + 1))
		fi
	done
	# The corpus, old and new, must pass as seeds in plain go test.
	if ! go test -count=1 -run "^$target\$" "$pkg" >/dev/null; then
		result="$result, corpus fails as seeds"
		status=1
	fi
	last=$(grep 'fuzz: elapsed' "$log" | tail -1 | sed 's/^fuzz: //')
	summary+=("$target: $result; ${last:-no progress line}; $kept new inputs kept in ${to#"$PWD"/}")
done <<<"$targets"

echo
printf '%s\n' "${summary[@]}"
exit $status
