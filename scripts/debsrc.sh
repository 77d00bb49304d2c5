# Sourced by scripts/extensions.sh, scripts/pgbouncer.sh and
# scripts/postgresql.sh: finds the host's Debian mirror, and fetches and
# unpacks a pinned source package from the Debian suite named in
# scripts/extensions.env ($DBCLOUD_EXT_SUITE), on the mirror the host
# already uses (a deb-src line in its own file), by `apt-get source`, never
# as a tarball from elsewhere. The caller defines fail() and runs as root.

DEBSRC_LIST=/etc/apt/sources.list.d/dbcloud-extensions-src.list

# debian_mirror [security] prints the Debian mirror the host's own apt
# sources name (deb.debian.org when they name none), or with "security"
# its security archive (nothing when they name none).
debian_mirror() {
	local lists=() f found
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
		if [ -f "$f" ] && [ "$f" != "$DEBSRC_LIST" ]; then lists+=("$f"); fi
	done
	found=$(grep -hoE '^[^#]*https?://[^ ]+/debian(-security)?/?( |$)' "${lists[@]}" 2>/dev/null |
		grep -oE 'https?://[^ ]+' | sed 's,/$,,' || true)
	if [ "${1:-}" = security ]; then
		grep -m1 -- "-security$" <<<"$found" || true
	else
		grep -v -- "-security$" <<<"$found" | grep -m1 . || echo http://deb.debian.org/debian
	fi
}

# debsrc_unpack PKG VERSION DIR LOG unpacks PKG=VERSION into DIR/tree
# (DIR must be empty), logging to LOG. apt checks the files against the
# signed Sources index, so dpkg-source need not check them again.
debsrc_unpack() {
	local pkg=$1 srcver=$2 dir=$3 buildlog=$4 mirror line
	mirror=$(debian_mirror)
	line="deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror%/} $DBCLOUD_EXT_SUITE main"
	if [ "$(cat "$DEBSRC_LIST" 2>/dev/null)" != "$line" ]; then
		echo "$line" >"$DEBSRC_LIST"
	fi
	if ! apt-cache showsrc "$pkg" 2>/dev/null | grep -qx "Version: $srcver"; then
		# Refresh only this source's index; the host's other lists stay as they are.
		apt-get update -qq -o Dir::Etc::sourcelist="$DEBSRC_LIST" -o Dir::Etc::sourceparts=- \
			-o APT::Get::List-Cleanup=0 >>"$buildlog" 2>&1 || fail "cannot read the $DBCLOUD_EXT_SUITE source index from $mirror"
		apt-cache showsrc "$pkg" 2>/dev/null | grep -qx "Version: $srcver" ||
			fail "$mirror $DBCLOUD_EXT_SUITE has no source package $pkg $srcver"
	fi
	(
		cd "$dir"
		apt-get source -qq --download-only "$pkg=$srcver" >>"$buildlog" 2>&1 || fail "apt-get source $pkg=$srcver failed"
		dpkg-source -x --no-check ./*.dsc tree >>"$buildlog" 2>&1 || fail "unpacking the source failed"
	)
}
