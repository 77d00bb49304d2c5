# Chaos runs (docs/chaos.md); tests are scripts/test.sh. Run as root from
# the module root (they start PostgreSQL).
export PATH := $(PATH):/usr/local/go/bin

# SEED=0 picks a seed, printed at the start; SEED=n ROUNDS=m replays a run.
SEED ?= 0
ROUNDS ?= 20

.PHONY: chaos chaos-short

# Rounds of random API operations while dbcloud and postmasters are killed
# with SIGKILL, each followed by the invariant checks (about 10 s a round).
chaos:
	go test -count=1 -v -timeout 0 -run '^TestChaos$$' ./e2e -chaos.rounds=$(ROUNDS) -chaos.seed=$(SEED) -chaos.services=5

# Three rounds with a new seed; CI runs three with seed 11 (the default).
chaos-short:
	go test -count=1 -v -timeout 30m -run '^TestChaos$$' ./e2e -chaos.rounds=3 -chaos.seed=$(SEED)
