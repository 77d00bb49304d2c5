#!/usr/bin/env bash
# Builds and installs one PostgreSQL extension for one of the host's
# PostgreSQL versions (15 by default) from a Debian 13 source package, when
# the installed one is missing or not the pinned version.
# Usage: scripts/extensions.sh timescaledb|pgvector [MAJOR]
# ($PG_CONFIG, if set, names the version's pg_config instead of MAJOR).
#
# Debian 12 ships neither TimescaleDB nor pgvector for PostgreSQL 15, and
# Debian 13's binary packages need a newer libc, so the sources come from
# Debian 13's archive on the mirror the host already uses (a deb-src line in
# its own file), fetched by `apt-get source`, never as tarballs from
# elsewhere. The versions are pinned in scripts/extensions.env. A finished
# build is kept under $DBCLOUD_EXT_CACHE/<package>-<version> and copied
# into place again when PostgreSQL was reinstalled; an installed extension
# of the pinned version costs no work at all.
#
# TimescaleDB is built as its Apache-2 edition (-DAPACHE_ONLY=ON) with
# telemetry compiled out (-DUSE_TELEMETRY=OFF): no service ever connects to
# Timescale's servers.
#
# Exits non-zero when the extension cannot be had (no source reachable, a
# failed build); scripts/deps.sh then warns and dbcloud answers the addon
# with ADDON_UNAVAILABLE.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=extensions.env
. "$here/extensions.env"
# shellcheck source=debsrc.sh
. "$here/debsrc.sh"
# shellcheck source=buildlib.sh
. "$here/buildlib.sh"

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/${2:-15}/bin/pg_config}
CACHE=${DBCLOUD_EXT_CACHE:-/var/cache/dbcloud/extensions}
# The major version, from Debian's layout /usr/lib/postgresql/N/bin.
major=$(basename "$(dirname "$(dirname "$PG_CONFIG")")")

pkg=${1:?usage: extensions.sh timescaledb|pgvector [MAJOR]}
case "$pkg" in
timescaledb) srcver=$TIMESCALEDB_SRC_VERSION ext=timescaledb ;;
pgvector) srcver=$PGVECTOR_SRC_VERSION ext=vector ;;
*) echo "extensions.sh: unknown extension $pkg" >&2; exit 2 ;;
esac
# The upstream version, which is the control file's default_version:
# 2.19.3+dfsg-1+deb13u1 -> 2.19.3.
upver=${srcver#*:}
upver=${upver%%-*}
upver=${upver%%+*}

log() { echo "dbcloud: $pkg $upver for PostgreSQL $major: $*" >&2; }

# installed succeeds when PostgreSQL has the pinned version: the control
# file names it as default_version and the versioned library exists.
installed() {
	[ -x "$PG_CONFIG" ] || return 1
	local share lib so
	share=$("$PG_CONFIG" --sharedir) lib=$("$PG_CONFIG" --pkglibdir)
	case "$pkg" in
	timescaledb) so="$lib/timescaledb-$upver.so" ;;
	pgvector) so="$lib/vector.so" ;;
	esac
	grep -Eq "^default_version *= *'$upver'" "$share/extension/$ext.control" 2>/dev/null && [ -f "$so" ]
}

dir="$CACHE/$pkg-$srcver-pg$major"
# done_already: installed, and, when the caller copies the build from the cache (the Kubernetes
# image, DBCLOUD_EXT_KEEP_BUILD=1), the cached build is there too: an install whose cache was
# removed is built again.
done_already() { installed && { [ "${DBCLOUD_EXT_KEEP_BUILD:-}" != 1 ] || [ -f "$dir/complete" ]; }; }
if done_already; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	exec sudo -n "$0" "$@"
fi

# install copies the build into place. Each file is unlinked first, never
# overwritten: running postmasters have the old libraries mapped, and
# writing into a mapped library would crash them.
install_build() { cp -a --remove-destination "$dir/root/." /; }

# One build at a time on a host: another run may be building this very
# version; once it is done there is nothing left to do.
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if done_already; then
	exit 0
fi

if [ -f "$dir/complete" ]; then
	log "installing the cached build from $dir"
	install_build
	installed && exit 0
	log "the cached build does not install the pinned version; building again"
	rm -rf "$dir"
fi

start=$(date +%s)
mkdir -p "$dir"
build_log "$dir/build.log"
build_deps $(server_dev "$major") build-essential cmake dpkg-dev
[ -x "$PG_CONFIG" ] || fail "$PG_CONFIG not found: PostgreSQL $major is not installed (scripts/postgresql.sh $major)"

rm -rf "$dir/src" "$dir/root"
mkdir -p "$dir/src"
log "fetching the source package"
debsrc_unpack "$pkg" "$srcver" "$dir/src" "$buildlog"
cd "$dir/src/tree"

log "building (log: $buildlog)"
export PG_CONFIG
case "$pkg" in
timescaledb)
	nice -n 19 ./bootstrap -DPG_CONFIG="$PG_CONFIG" -DAPACHE_ONLY=ON -DUSE_TELEMETRY=OFF -DSEND_TELEMETRY_DEFAULT=OFF \
		-DREGRESS_CHECKS=OFF -DTAP_CHECKS=OFF -DGENERATE_DOWNGRADE_SCRIPT=OFF -DWARNINGS_AS_ERRORS=OFF \
		-DCMAKE_BUILD_TYPE=Release >>"$buildlog" 2>&1 || fail "cmake failed"
	nice -n 19 make -C build -j"$(nproc)" >>"$buildlog" 2>&1 || fail "make failed"
	make -C build install DESTDIR="$dir/root" >>"$buildlog" 2>&1 || fail "make install failed"
	;;
pgvector)
	# with_llvm=no: no JIT bitcode, so clang's version need not match.
	nice -n 19 make -j"$(nproc)" with_llvm=no >>"$buildlog" 2>&1 || fail "make failed"
	make install with_llvm=no DESTDIR="$dir/root" >>"$buildlog" 2>&1 || fail "make install failed"
	;;
esac

install_build
installed || fail "the build did not install $ext $upver"
rm -rf "$dir/src"
touch "$dir/complete"
log "built and installed in $(($(date +%s) - start)) s"
