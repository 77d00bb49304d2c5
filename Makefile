# Benchmarks, fuzzing and chaos runs; tests are scripts/test.sh. Run as
# root from the module root (they start PostgreSQL).
export PATH := $(PATH):/usr/local/go/bin

.PHONY: bench bench-short fuzz chaos chaos-short chaos-long e2e-kube screenshots

# Every benchmark, one after another (about 32 minutes here with BASE), into
# bench/report.md and bench/report.json; raw go test output in bench/out/.
# BASE=rev also runs each section at that commit, alternating with ours,
# so old numbers sit beside new ones from the same run.
BASE ?=
bench:
	go run ./cmd/dbcloud-bench $(if $(BASE),-base $(BASE))

# The same with tiny sizes, into bench/out/short/: checks that every
# benchmark and the report work, in a few minutes. Not measurements.
bench-short:
	go run ./cmd/dbcloud-bench -short -check

# Each fuzz target for FUZZTIME seconds; new interesting inputs are kept
# in the repository corpus (PKG/testdata/fuzz/).
FUZZTIME ?= 60
fuzz:
	scripts/fuzz.sh $(FUZZTIME)

# Chaos (docs/chaos.md). SEED=0 picks a seed, printed at the start;
# SEED=n ROUNDS=m replays a run.
SEED ?= 0
ROUNDS ?= 20

# Rounds of random API operations while dbcloud and postmasters are killed
# with SIGKILL, each followed by the invariant checks (about 10 s a round).
chaos:
	go test -count=1 -v -timeout 0 -run '^TestChaos$$' ./e2e -chaos.rounds=$(ROUNDS) -chaos.seed=$(SEED) -chaos.services=5

# The long run (TestChaos_Long): two planes on a PostgreSQL store, disk-full
# and quota moments, LONG_ROUNDS rounds (default 1000), then bench/chaos.md
# with the seed, rounds, duration and violations. SEED=n replays; FOR=30m
# starts no round after 30 minutes.
LONG_ROUNDS ?= 1000
FOR ?= 0
chaos-long:
	bench/chaos-long.sh $(LONG_ROUNDS) $(SEED) $(FOR)

# Three rounds with a new seed; CI runs three with seed 11 (the default).
chaos-short:
	go test -count=1 -v -timeout 30m -run '^TestChaos$$' ./e2e -chaos.rounds=3 -chaos.seed=$(SEED)

# The e2e suite with -e2e.runtime=kubernetes against real pods: a single-node
# cluster with CloudNativePG built and started on this machine
# (scripts/kube-node.sh, docs/kubernetes.md), taken down afterwards
# (KUBE_KEEP=1 leaves it up). RUN=pattern narrows the tests.
RUN ?=
e2e-kube:
	E2E_RUN='$(RUN)' scripts/e2e-kube.sh

# The console's screenshots in docs/screenshots: the browser test (real
# Chromium, real services) captures its pages, and a handful of them at
# 390, 768, 1280 and 1440 px as NAME-WIDTH.png.
screenshots:
	DBCLOUD_SCREENSHOTS=$(CURDIR)/docs/screenshots go test -count=1 -timeout 20m -run '^TestBrowserConsole$$' ./e2e/
