#!/usr/bin/env bash
# Installs what dbcloud needs on Debian 12, only when it is missing:
# PostgreSQL 15 (the local runtime's server binaries), PgBouncer 1.24 (the
# connection pooler: Debian 12's 1.18 lacks auth_dbname, so
# scripts/pgbouncer.sh builds Debian 13's source into /usr/local/lib/dbcloud;
# about 30 s on a fresh machine, 85 s when its build dependencies must be
# installed first, then cached; without it dbcloud refuses poolers),
# btrfs-progs (per-service volumes with quotas and copy-on-write clones, on
# a btrfs runtime directory or storage image), and the extensions behind
# the addons, TimescaleDB
# (time-series) and pgvector (ai), which Debian 12 does not ship: they are
# built from Debian 13 source packages by scripts/extensions.sh (versions
# pinned in scripts/extensions.env; about 35 s on a fresh machine, then
# cached). If they cannot be built, dbcloud still runs and answers those
# addons with ADDON_UNAVAILABLE. It also builds dbcloud_guard, the library
# every instance preloads to keep tenants inside their own database
# (scripts/guard.sh, docs/security.md); without it tenants could reach the
# host, so a failed build fails this script. PostgreSQL 17 is installed beside
# 15 from Debian 13's binary packages (scripts/postgresql.sh), with their
# TimescaleDB and pgvector, then the guard is built for it; without it
# services run on 15 only. Go must be on PATH or in
# /usr/local/go.
# Safe to run again: it changes nothing that is in place.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for pkg in postgresql-15 postgresql-contrib btrfs-progs; do
	have_pkg "$pkg" || need+=("$pkg")
done
# Headless Chromium drives the console's browser tests (e2e/browser_test.go);
# dbcloud itself does not need it.
have_pkg chromium || need+=(chromium)

if [ "${#need[@]}" -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
	echo "dbcloud: installing ${need[*]}" >&2
	$SUDO apt-get update -qq
	# The postgresql-common hook would create and start a default cluster;
	# dbcloud runs its own clusters, so keep the packaged one from starting.
	$SUDO mkdir -p /etc/postgresql-common/createcluster.d
	echo "create_main_cluster = false" | $SUDO tee /etc/postgresql-common/createcluster.d/dbcloud.conf >/dev/null
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# axe-core, the accessibility checker the browser tests run in every
# console page, at a pinned version from npm (scripts/axe.sh; cached).
if ! "$(dirname "$0")/axe.sh" >/dev/null; then
	echo "dbcloud: WARNING: could not fetch axe-core; the console's browser tests will fail" >&2
fi

for ext in timescaledb pgvector; do
	if ! "$(dirname "$0")/extensions.sh" "$ext"; then
		echo "dbcloud: WARNING: could not build the $ext extension; services with its addon will answer ADDON_UNAVAILABLE" >&2
	fi
done

if ! "$(dirname "$0")/pgbouncer.sh"; then
	echo "dbcloud: WARNING: could not build PgBouncer; dbcloud refuses connection poolers until it is built" >&2
fi

if ! "$(dirname "$0")/guard.sh"; then
	echo "dbcloud: ERROR: could not build the dbcloud_guard library (extensions/dbcloud_guard); dbcloud does not run services without it" >&2
	exit 1
fi

# PostgreSQL 17 beside 15 (scripts/postgresql.sh), with the same
# extensions (Debian 13's builds, which postgresql.sh installs: extensions.sh
# finds them in place and builds only if they are not) and the guard.
# Without it dbcloud offers 15 only: creates asking for 17 answer 400
# naming the versions there are.
if "$(dirname "$0")/postgresql.sh" 17; then
	for ext in timescaledb pgvector; do
		if ! "$(dirname "$0")/extensions.sh" "$ext" 17; then
			echo "dbcloud: WARNING: could not build the $ext extension for PostgreSQL 17; services on 17 with its addon will answer ADDON_UNAVAILABLE" >&2
		fi
	done
	if ! "$(dirname "$0")/guard.sh" 17; then
		echo "dbcloud: WARNING: could not build dbcloud_guard for PostgreSQL 17; dbcloud offers PostgreSQL 15 only" >&2
	fi
else
	echo "dbcloud: WARNING: could not install PostgreSQL 17; dbcloud offers PostgreSQL 15 only" >&2
fi

if ! command -v go >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then
		echo "dbcloud: add /usr/local/go/bin to PATH" >&2
	else
		echo "dbcloud: Go 1.26 or newer is required (https://go.dev/doc/install)" >&2
		exit 1
	fi
fi
