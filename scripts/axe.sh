#!/usr/bin/env bash
# Fetches axe-core, the accessibility checker the console's browser tests
# run inside each page (e2e/browser_test.go), at a pinned version from the
# npm registry through npm itself, which checks the tarball against the
# registry's integrity; the script then checks it against the integrity
# pinned here, so a changed release cannot slip in. dbcloud itself does
# not need it. Prints the path of axe.min.js; a cached copy costs no work.
#
# nodejs and npm come from Debian's packages when they are missing.
set -euo pipefail
AXE_VERSION=4.10.2
AXE_INTEGRITY=sha512-RE3mdQ7P3FRSe7eqCWoeQ/Z9QXrtniSjp1wUjt5nRC3WIpz5rSCve6o3fsZ2aCpJtrZjSZgjwXAoTO5k4tEI0w==
CACHE=${DBCLOUD_AXE_CACHE:-/var/cache/dbcloud/axe-core}
dir="$CACHE/$AXE_VERSION"
js="$dir/package/axe.min.js"

if [ -s "$js" ]; then
	echo "$js"
	exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
	if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
	echo "dbcloud: installing nodejs and npm (for axe-core)" >&2
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "axe-core@$AXE_VERSION" >/dev/null)
tgz="$tmp/axe-core-$AXE_VERSION.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
if [ "$got" != "$AXE_INTEGRITY" ]; then
	echo "dbcloud: axe-core $AXE_VERSION: integrity $got, want $AXE_INTEGRITY" >&2
	exit 1
fi
mkdir -p "$tmp/out"
tar -xzf "$tgz" -C "$tmp/out" package/axe.min.js package/LICENSE package/package.json
mkdir -p "$CACHE"
rm -rf "$dir"
mv "$tmp/out" "$dir"
echo "$js"
