#!/bin/sh
# Times the log reader beside `tac FILES | grep -m 500 TERM` on the same
# 1,000,000-line data (made once by the benchmarks, ~460 MB in $TMPDIR), in
# the same run, and prints the medians and the ratios. The runs alternate
# (one of each per round), so load from other processes falls on both.
#
#   pglog/bench.sh [ROUNDS]     (from the module root; default 5 rounds)
set -eu
rounds=${1:-5}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -c -o "$out.test" ./pglog/
trap 'rm -f "$out" "$out.test"' EXIT
i=0
while [ "$i" -lt "$rounds" ]; do
	"$out.test" -test.run '^$' -test.bench '^Benchmark(FirstPage|SearchRare|TacGrepFirstPage|TacGrepRare)$' \
		-test.benchtime 10x | grep '^Benchmark' >>"$out"
	i=$((i + 1))
done
awk '
	{ name = $1; sub(/-[0-9]+$/, "", name); v[name, ++n[name]] = $3 }
	function median(name,   i, j, t, c) {
		c = n[name]
		for (i = 1; i <= c; i++) a[i] = v[name, i]
		for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2
	}
	END {
		fp = median("BenchmarkFirstPage"); tf = median("BenchmarkTacGrepFirstPage")
		sr = median("BenchmarkSearchRare"); tr = median("BenchmarkTacGrepRare")
		printf "median of %d rounds of 10 runs each\n", n["BenchmarkFirstPage"]
		printf "first page, no filter:   pglog %8.2f ms   tac|grep -m 500 %8.2f ms   time ratio %.2f (reader / tac|grep: below 1 the reader is faster)\n", fp / 1e6, tf / 1e6, fp / tf
		printf "search, 1 line in 10000: pglog %8.2f ms   tac|grep -m 500 %8.2f ms   time ratio %.2f (reader / tac|grep: below 1 the reader is faster)\n", sr / 1e6, tr / 1e6, sr / tr
	}' "$out"
