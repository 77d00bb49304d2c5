#!/usr/bin/env bash
# Builds and installs a PostgreSQL major version that Debian 12 does not
# ship (17) from Debian 13's source package, beside the host's 15, in
# Debian's layout: /usr/lib/postgresql/N/bin, /usr/lib/postgresql/N/lib
# (with its own libpq: the host's libpq5 stays untouched),
# /usr/share/postgresql/N, /usr/include/postgresql/N/server.
# Usage: scripts/postgresql.sh 17
#
# The source comes from Debian 13's archive as the extensions' do
# (scripts/debsrc.sh, version pinned in scripts/extensions.env). The build
# is lean: configured here from the unpacked source with what the runtime
# uses (OpenSSL, ICU, LZ4, Zstandard, libuuid for uuid-ossp, the system's
# time zones, the contrib modules such as amcheck), without LLVM, NLS,
# libxml, documentation or tests, and always at the lowest CPU priority.
# The result is kept under $DBCLOUD_PG_CACHE/postgresql-N-<version> and
# copied into place again when missing; an installed build of the pinned
# version costs no work at all.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=extensions.env
. "$here/extensions.env"
# shellcheck source=debsrc.sh
. "$here/debsrc.sh"
# shellcheck source=buildlib.sh
. "$here/buildlib.sh"

CACHE=${DBCLOUD_PG_CACHE:-/var/cache/dbcloud/postgresql}
major=${1:?usage: postgresql.sh 17}
case "$major" in
17) srcver=$POSTGRESQL17_SRC_VERSION ;;
*) echo "postgresql.sh: no pinned source for PostgreSQL $major" >&2; exit 2 ;;
esac
pkg=postgresql-$major
# 17.12-0+deb13u1 -> 17.12, what `postgres --version` ends with.
upver=${srcver%%-*}
bindir=/usr/lib/postgresql/$major/bin

log() { echo "dbcloud: $pkg $upver: $*" >&2; }

# installed succeeds when the pinned version's server, pg_config and the
# contrib modules the runtime needs (amcheck, for pg_amcheck) are in place.
installed() {
	[ -x "$bindir/postgres" ] && [ -x "$bindir/pg_config" ] &&
		[ "$("$bindir/postgres" --version 2>/dev/null | awk '{print $3}')" = "$upver" ] &&
		[ -f "/usr/share/postgresql/$major/extension/amcheck.control" ]
}

if installed; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	exec sudo -n "$0" "$@"
fi

# install_build copies the build into place, unlinking each file first:
# running postmasters have the old libraries mapped.
install_build() { cp -a --remove-destination "$dir/root/." /; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if installed; then
	exit 0
fi

dir="$CACHE/$pkg-$srcver"
# The archive's refusal of the source (a 404, which asking again does not
# change) is remembered for a day: every deps.sh run would otherwise wait
# for it again.
refused="$CACHE/$pkg-$srcver.refused"
if [ -n "$(find "$refused" -mmin -1440 2>/dev/null)" ]; then
	log "the archive refused the source $(cat "$refused"); not asking again within a day (rm $refused to retry)"
	exit 1
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
# The source first: where the archive refuses it, nothing else is
# installed for nothing.
build_deps dpkg-dev
rm -rf "$dir/src" "$dir/root"
mkdir -p "$dir/src"
log "fetching the source package"
if ! debsrc_unpack "$pkg" "$srcver" "$dir/src" "$buildlog"; then
	date -u +"on %Y-%m-%d at %H:%M UTC" >"$refused"
	exit 1
fi
# The release tarball carries the parser and scanner already generated:
# no bison or flex.
build_deps build-essential pkg-config libssl-dev libicu-dev liblz4-dev libzstd-dev \
	libreadline-dev zlib1g-dev uuid-dev
cd "$dir/src/tree"

log "configuring (log: $buildlog)"
nice -n 19 ./configure --prefix="/usr/lib/postgresql/$major" --bindir="$bindir" \
	--libdir="/usr/lib/postgresql/$major/lib" --datadir="/usr/share/postgresql/$major" \
	--includedir="/usr/include/postgresql/$major" --sysconfdir=/etc/postgresql-common \
	--mandir="/usr/share/postgresql/$major/man" --docdir="/usr/share/doc/$pkg" \
	--with-extra-version=" (Debian $srcver)" --with-openssl --with-icu --with-lz4 --with-zstd \
	--with-uuid=e2fs --with-system-tzdata=/usr/share/zoneinfo --with-pgport=5432 \
	--without-llvm --disable-nls --without-libxml \
	CFLAGS="-O2 -fstack-protector-strong -Wformat -Werror=format-security -fno-omit-frame-pointer" \
	LDFLAGS="-Wl,-z,relro -Wl,-z,now" >>"$buildlog" 2>&1 || fail "configure failed"
log "building"
# world-bin: the server, the client programs and contrib, without docs.
nice -n 19 make -j"$(nproc)" world-bin >>"$buildlog" 2>&1 || fail "make failed"
nice -n 19 make install-world-bin DESTDIR="$dir/root" >>"$buildlog" 2>&1 || fail "make install failed"

install_build
installed || fail "the build did not install PostgreSQL $upver"
rm -rf "$dir/src"
touch "$dir/complete"
log "built and installed in $(($(date +%s) - start)) s"
