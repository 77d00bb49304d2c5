# Sourced by the scripts that build from source (guard.sh, extensions.sh,
# pgbouncer.sh): a build log with the one way to fail, and the build
# dependencies installed with apt-get when missing. The caller defines
# log() and runs as root.

# build_log FILE starts the build log FILE (empty) and defines fail(),
# which says why, shows the log's last lines and exits.
build_log() {
	buildlog=$1
	: >"$buildlog"
	fail() {
		log "$* (last lines of $buildlog follow)"
		tail -n 20 "$buildlog" >&2
		exit 1
	}
}

# build_deps PKG... installs the packages that are not installed yet,
# logging to the build log.
build_deps() {
	local need=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
	done
	if [ "${#need[@]}" -gt 0 ]; then
		log "installing build dependencies ${need[*]}"
		apt-get update -qq >>"$buildlog" 2>&1 || fail "apt-get update failed"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >>"$buildlog" 2>&1 ||
			fail "installing ${need[*]} failed"
	fi
}

# server_dev MAJOR names the Debian package with the server headers of
# PostgreSQL MAJOR when Debian 12 ships that version (15); a version that
# scripts/postgresql.sh installs comes with its headers: none.
server_dev() {
	case "$1" in
	15) echo "postgresql-server-dev-$1" ;;
	esac
}
