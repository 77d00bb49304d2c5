#!/usr/bin/env bash
# Builds and installs the PgBouncer dbcloud runs for connection poolers,
# from the Debian 13 source package pinned in scripts/extensions.env, into
# a prefix of its own: $DBCLOUD_PGBOUNCER_ROOT/pgbouncer-<version>, with
# $DBCLOUD_PGBOUNCER_ROOT/pgbouncer pointing at it (dbcloud's default
# binary is $DBCLOUD_PGBOUNCER_ROOT/pgbouncer/bin/pgbouncer).
#
# Debian 12 ships PgBouncer 1.18, which has no auth_dbname (added in 1.19):
# its lookup query runs in whatever database the client names, so a tenant
# who creates a database can answer it (docs/security.md). Debian 13's
# binary package needs a newer libc; its source builds here. Only the
# program is built (plain configure and make: no Debian packaging, no
# manual pages, so no pandoc), and Debian's packaged pgbouncer is left as
# it is.
#
# A finished build is kept under $DBCLOUD_PGBOUNCER_CACHE/<version>; an
# installed binary of the pinned version costs no work at all. Exits
# non-zero when PgBouncer cannot be had; scripts/deps.sh then warns, and
# dbcloud answers a pooler request with "not installed".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=extensions.env
. "$here/extensions.env"
# shellcheck source=debsrc.sh
. "$here/debsrc.sh"
# shellcheck source=buildlib.sh
. "$here/buildlib.sh"

ROOT=${DBCLOUD_PGBOUNCER_ROOT:-/usr/local/lib/dbcloud}
CACHE=${DBCLOUD_PGBOUNCER_CACHE:-/var/cache/dbcloud/pgbouncer}
srcver=$PGBOUNCER_SRC_VERSION
# The upstream version PgBouncer reports: 1.24.1-1+deb13u2 -> 1.24.1.
upver=${srcver#*:}
upver=${upver%%-*}
prefix="$ROOT/pgbouncer-$srcver"
link="$ROOT/pgbouncer"

log() { echo "dbcloud: pgbouncer $srcver: $*" >&2; }

# installed succeeds when the stable link leads to a binary of the pinned
# version.
installed() {
	[ "$(readlink "$link" 2>/dev/null)" = "pgbouncer-$srcver" ] &&
		[ "$("$prefix/bin/pgbouncer" --version 2>/dev/null | head -n 1)" = "PgBouncer $upver" ]
}

if installed; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	exec sudo -n "$0" "$@"
fi

# install_build copies the build into its versioned prefix (new files
# renamed into place, never written over: running poolers execute the old
# binary) and then points the stable link at it with one rename.
install_build() {
	mkdir -p "$prefix/bin"
	install -m 0755 "$dir/pgbouncer" "$prefix/bin/pgbouncer.new"
	mv -f "$prefix/bin/pgbouncer.new" "$prefix/bin/pgbouncer"
	ln -sfn "pgbouncer-$srcver" "$link.new"
	mv -fT "$link.new" "$link"
}

# One build at a time on a host.
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if installed; then
	exit 0
fi

dir="$CACHE/$srcver"
if [ -f "$dir/complete" ]; then
	log "installing the cached build from $dir"
	install_build
	installed && exit 0
	log "the cached build is not PgBouncer $upver; building again"
fi
rm -rf "$dir"

start=$(date +%s)
mkdir -p "$dir"
build_log "$dir/build.log"
build_deps build-essential dpkg-dev pkgconf libevent-dev libssl-dev libc-ares-dev

mkdir -p "$dir/src"
log "fetching the source package"
debsrc_unpack pgbouncer "$srcver" "$dir/src" "$buildlog"
cd "$dir/src/tree"

log "building (log: $buildlog)"
# TLS and c-ares DNS as Debian builds it; no PAM, LDAP or systemd socket
# activation: dbcloud starts PgBouncer itself and clients sign in by SCRAM.
./configure --prefix="$prefix" --with-openssl --with-cares --without-pam --without-systemd \
	>>"$buildlog" 2>&1 || fail "configure failed"
make -j"$(nproc)" pgbouncer >>"$buildlog" 2>&1 || fail "make failed"
mv pgbouncer "$dir/pgbouncer"
cd /
rm -rf "$dir/src"
touch "$dir/complete"
install_build
installed || fail "the build did not install PgBouncer $upver"
log "built and installed in $(($(date +%s) - start)) s"
