#!/usr/bin/env bash
# Builds and installs dbcloud_guard (extensions/dbcloud_guard), the library
# every instance preloads to keep tenants inside their own database
# (docs/security.md), against one of the host's PostgreSQL versions (15 by
# default) with PGXS. Usage: scripts/guard.sh [MAJOR] ($PG_CONFIG, if set,
# names the version's pg_config instead).
#
# The build is kept under $DBCLOUD_EXT_CACHE/dbcloud_guard-<hash>, where the
# hash covers the source and the server's version: a second run with the
# same source and an installed library identical to that build does no work;
# a changed source (or a reinstalled PostgreSQL) builds or copies again.
# Exits non-zero when the library cannot be built or installed: dbcloud must
# not run services without it (scripts/deps.sh fails, and dbcloud refuses to
# start when the library is missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=buildlib.sh
. "$here/buildlib.sh"
src="$here/../extensions/dbcloud_guard"
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/${1:-15}/bin/pg_config}
CACHE=${DBCLOUD_EXT_CACHE:-/var/cache/dbcloud/extensions}
major=$(basename "$(dirname "$(dirname "$PG_CONFIG")")")

log() { echo "dbcloud: dbcloud_guard for PostgreSQL $major: $*" >&2; }

[ -x "$PG_CONFIG" ] || { log "$PG_CONFIG not found: PostgreSQL $major is not installed"; exit 1; }
hash=$({ "$PG_CONFIG" --version; cat "$src/Makefile" "$src"/*.c "$src"/*.h; } | sha256sum | cut -c1-16)
dir="$CACHE/dbcloud_guard-$hash"
lib="$("$PG_CONFIG" --pkglibdir)/dbcloud_guard.so"

installed() { [ -f "$dir/dbcloud_guard.so" ] && cmp -s "$dir/dbcloud_guard.so" "$lib"; }

if installed; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	exec sudo -n "$0" "$@"
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if installed; then
	exit 0
fi

if [ ! -f "$dir/dbcloud_guard.so" ]; then
	start=$(date +%s)
	rm -rf "$dir"
	mkdir -p "$dir/src"
	build_log "$dir/build.log"
	build_deps $(server_dev "$major") build-essential
	cp "$src/Makefile" "$src"/*.c "$src"/*.h "$dir/src/"
	# with_llvm=no: no JIT bitcode, so clang's version need not match.
	nice -n 19 make -C "$dir/src" -j2 with_llvm=no PG_CONFIG="$PG_CONFIG" >>"$buildlog" 2>&1 || fail "make failed"
	mv "$dir/src/dbcloud_guard.so" "$dir/dbcloud_guard.so"
	rm -rf "$dir/src"
	log "built in $(($(date +%s) - start)) s"
fi
# Unlink, never overwrite: running postmasters have the old library mapped.
install -m 0755 -D "$dir/dbcloud_guard.so" "$lib.new"
mv -f "$lib.new" "$lib"
installed || { log "installing into $lib failed"; exit 1; }
log "installed $lib"
