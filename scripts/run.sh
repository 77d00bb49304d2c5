#!/usr/bin/env bash
# Runs dbcloud with its embedded defaults: SQLite and TLS files in
# ./dbcloud-data, the API on https://127.0.0.1:8443. Extra arguments go to
# `dbcloud serve` (see `dbcloud serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/deps.sh
go build -o dbcloud ./cmd/dbcloud
exec ./dbcloud serve "$@"
