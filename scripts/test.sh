#!/usr/bin/env bash
# Runs every test, against both stores (the PostgreSQL store tests start
# their own throwaway server), plus the fuzz seed corpora and a race run of
# the concurrent store code.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/deps.sh
go vet ./...
go test -count=1 -timeout 20m ./...
go test -count=1 -race -timeout 10m ./sqlite/ ./http/
