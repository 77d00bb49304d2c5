#!/usr/bin/env bash
# Installs a PostgreSQL major version that Debian 12 does not ship (17)
# beside the host's 15, from Debian 13's (trixie) binary packages, in
# Debian's layout: /usr/lib/postgresql/N/bin and lib, /usr/share/postgresql/N,
# /usr/include/postgresql/N/server (for PGXS). With it come trixie's builds
# of pgvector and TimescaleDB for N (Debian's TimescaleDB is the Apache 2
# edition, built without telemetry). Usage: scripts/postgresql.sh 17
#
# Debian 13's binaries need trixie's glibc (2.41; Debian 12 has 2.36), so
# they run on a private trixie root: mmdebstrap extracts the packages and
# every library they depend on from the host's own Debian mirror (nothing
# else is downloaded) into $DBCLOUD_PG_CACHE/trixie-N-<version>, and
# patchelf points each PostgreSQL program and library at that root's
# dynamic loader and libraries (DT_RPATH, which unlike DT_RUNPATH also
# covers the libraries' own dependencies and dlopen). No environment
# variable is involved, so the host programs PostgreSQL starts
# (archive_command's shell, cp) keep the host's libraries. Extensions
# compiled on this host load too: trixie's glibc still provides the older
# symbol versions they ask for. Locale data and gconv modules stay the
# host's; the runtime's clusters use the C locale and UTF8, which need
# neither.
#
# The programs are copied into the Debian paths (not linked there) so that
# PostgreSQL, which finds its share directory and pg_config's paths from its
# own executable's real location, reports the same paths as a Debian
# install: no path of the cache reaches tenants' error messages or logs.
# The root is kept by version; an installed pinned version costs no work.
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
17) ver=$POSTGRESQL17_VERSION ;;
*) echo "postgresql.sh: no pinned version of PostgreSQL $major" >&2; exit 2 ;;
esac
pkg=postgresql-$major
root="$CACHE/trixie-$major-$ver"
# The loader and library directories every program and library is pointed at.
interp="$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
rpath="$root/usr/lib/postgresql/$major/lib:$root/usr/lib/x86_64-linux-gnu"
bindir=/usr/lib/postgresql/$major/bin

log() { echo "dbcloud: $pkg $ver: $*" >&2; }

# installed succeeds when the pinned version's server runs (so its root's
# loader and libraries are in place), with pg_config, the headers and the
# contrib modules the runtime needs (amcheck, for pg_amcheck).
installed() {
	[ -x "$bindir/postgres" ] && [ -x "$bindir/pg_config" ] &&
		[ "$("$bindir/postgres" --version 2>/dev/null)" = "postgres (PostgreSQL) ${ver%%-*} (Debian $ver)" ] &&
		[ -f "/usr/share/postgresql/$major/extension/amcheck.control" ] &&
		[ -f "/usr/include/postgresql/$major/server/postgres.h" ]
}

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

# install_root copies the root's PostgreSQL into Debian's paths, unlinking
# each file first: running postmasters have the old programs mapped.
install_root() {
	local d
	for d in lib/postgresql share/postgresql include/postgresql; do
		mkdir -p "/usr/$d/$major"
		cp -a --remove-destination "$root/usr/$d/$major/." "/usr/$d/$major/"
	done
}

if [ -f "$root/complete" ]; then
	log "installing from $root"
	install_root
	installed && exit 0
	log "the cached root does not run; making it again"
	rm -rf "$root"
fi

start=$(date +%s)
tmp=$(mktemp -d "$CACHE/.trixie-$major.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
build_log "$tmp/build.log"
build_deps mmdebstrap patchelf

# extract: the packages and their dependencies unpacked, no maintainer
# script run (no postgres user, no cluster, nothing started in the root).
# The server headers come without their Depends (clang and LLVM's headers,
# about 400 MB, which only JIT bitcode needs).
mirror=$(debian_mirror)
security=$(debian_mirror security)
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
sources=("deb [signed-by=$keyring] $mirror trixie main")
[ -z "$security" ] || sources+=("deb [signed-by=$keyring] $security trixie-security main")
log "extracting Debian 13's packages from $mirror (log: $buildlog)"
nice -n 19 mmdebstrap --variant=extract \
	--include="$pkg=$ver,$pkg-pgvector=$PGVECTOR_SRC_VERSION,$pkg-timescaledb=$TIMESCALEDB_SRC_VERSION" \
	--extract-hook='cd "$1/tmp" && APT_CONFIG=$MMDEBSTRAP_APT_CONFIG apt-get download -q '"postgresql-server-dev-$major=$ver"' &&
		dpkg-deb -x ./*.deb "$1" && rm ./*.deb' \
	--extract-hook='rm -rf "$1"/usr/share/doc "$1"/usr/share/man "$1"/usr/share/info "$1"/usr/share/lintian' \
	trixie "$tmp/root" "${sources[@]}" >>"$buildlog" 2>&1 || fail "mmdebstrap failed"

# The root's final paths go into the ELF files, so it moves into place
# first; it is marked complete only once patched and checked.
rm -rf "$root"
mv "$tmp/root" "$root"

# elf FILE succeeds for an ELF file.
elf() { [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
log "pointing the programs and libraries at $root"
patched=()
while IFS= read -r -d '' f; do
	elf "$f" || continue
	if patchelf --print-interpreter "$f" >/dev/null 2>&1; then
		patchelf --set-interpreter "$interp" "$f" >>"$buildlog" 2>&1 || fail "patchelf --set-interpreter $f failed"
	fi
	patchelf --force-rpath --set-rpath "$rpath" "$f" >>"$buildlog" 2>&1 || fail "patchelf --set-rpath $f failed"
	patched+=("$f")
done < <(find "$root/usr/lib/postgresql/$major" -type f -print0)
# A library with its own DT_RUNPATH (LLVM's) hides the programs' DT_RPATH
# from its dependencies: it gets the root's path too.
while IFS= read -r -d '' f; do
	if elf "$f" && readelf -d "$f" 2>/dev/null | grep -qE '\((RUNPATH|RPATH)\)'; then
		patchelf --force-rpath --set-rpath "$rpath" "$f" >>"$buildlog" 2>&1 || fail "patchelf --set-rpath $f failed"
		patched+=("$f")
	fi
done < <(find "$root/usr/lib/x86_64-linux-gnu" -maxdepth 1 -type f -name '*.so*' -print0)

# Every patched file must resolve each library inside the root: one from
# the host (an older libssl, say) would be mixed into trixie's glibc.
for f in "${patched[@]}"; do
	out=$("$interp" --list "$f" 2>&1) || fail "$f does not load: $out"
	if outside=$(grep '=>' <<<"$out" | grep -v "=> $root/"); then
		fail "$f loads libraries from outside $root: $outside"
	fi
done
for f in "$root/usr/lib/postgresql/$major/bin/"*; do
	elf "$f" || continue # pgindent, a Perl script
	"$f" --version >>"$buildlog" 2>&1 || fail "$f --version failed"
done
touch "$root/complete"

install_root
installed || fail "the installed PostgreSQL $major does not run"
rm -rf "$tmp"
trap - EXIT
log "installed in $(($(date +%s) - start)) s"
