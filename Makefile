# Benchmarks and fuzzing; tests are scripts/test.sh. Run as root from the
# module root (the benchmarks start PostgreSQL).
export PATH := $(PATH):/usr/local/go/bin

.PHONY: bench bench-short fuzz

# Every benchmark, one after another (about 10 minutes here), into
# bench/report.md and bench/report.json; raw go test output in bench/out/.
bench:
	go run ./cmd/dbcloud-bench

# The same with tiny sizes, into bench/out/short/: checks that every
# benchmark and the report work, in a few minutes. Not measurements.
bench-short:
	go run ./cmd/dbcloud-bench -short -check

# Each fuzz target for FUZZTIME seconds; new interesting inputs are kept
# in the repository corpus (PKG/testdata/fuzz/).
FUZZTIME ?= 60
fuzz:
	scripts/fuzz.sh $(FUZZTIME)
