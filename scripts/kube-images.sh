#!/usr/bin/env bash
# Builds the container images of the single-node cluster (scripts/kube-node.sh) from Debian
# packages and the Go binaries of scripts/kube-build.sh, and prints the path of a docker archive
# that `ctr images import` takes. No registry is involved anywhere: nothing can be pulled on the
# machines this runs on, and the cluster never tries (imagePullPolicy: Never).
#
#   scripts/kube-images.sh pause       sandbox image: deploy/images/pause/pause.c, gcc -static
#   scripts/kube-images.sh postgres    CNPG operand: Debian bookworm (mmdebstrap) with
#                                      postgresql-15, TimescaleDB and pgvector (the host's builds
#                                      of scripts/extensions.sh), postgres as uid 26
#   scripts/kube-images.sh postgres17  CNPG operand for 17: Debian trixie (mmdebstrap) with the
#                                      postgresql-17, pgvector and TimescaleDB packages at the
#                                      versions scripts/postgresql.sh installs on the host,
#                                      postgres as uid 26
#   scripts/kube-images.sh operator    CNPG's manager as /operator/manager_amd64, /manager -> it
#   scripts/kube-images.sh pgbouncer   PgBouncer for CNPG's Pooler: the version scripts/pgbouncer.sh
#                                      builds for the host (Debian 12's 1.18 lacks auth_dbname),
#                                      on Debian bookworm's libraries
#   scripts/kube-images.sh minio       MinIO's server (S3 object store for backups), on an empty root
#   scripts/kube-images.sh barman-plugin   the barman-cloud plugin's manager (its operator), on an
#                                      empty root
#   scripts/kube-images.sh barman-sidecar  the same manager beside barman's cloud tools from
#                                      Debian trixie (barman-cli-cloud, python3-boto3): the
#                                      container the plugin adds to every instance pod, uid 26
#   scripts/kube-images.sh dbcloud     dbcloud itself (deploy/): this checkout's binary, static
#                                      (CGO_ENABLED=0: pgx and modernc SQLite are pure Go), on an
#                                      empty root; it changes with every commit, so it is built and
#                                      imported by the test that deploys it, not by kube-node.sh up
#
# Each archive is kept under $KUBE_CACHE/images/<name>-<hash>.tar, the hash covering what goes
# into it (pins, sources, the binaries), so an unchanged image costs nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo="$here/.."
# shellcheck source=kube-node.env
. "$here/kube-node.env"
# shellcheck source=buildlib.sh
. "$here/buildlib.sh"
# shellcheck source=debsrc.sh
. "$here/debsrc.sh"

what=${1:?usage: kube-images.sh pause|postgres|postgres17|operator|pgbouncer|minio|barman-plugin|barman-sidecar|dbcloud}
log() { echo "dbcloud: kube image $what: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "run as root (mmdebstrap, image file ownership)"; exit 1; }
CACHE="$KUBE_CACHE/images"
mkdir -p "$CACHE"

# mmdebstrap reads the host's own Debian sources (deb822), so the images come from the same
# Debian mirror as the host's packages and from nowhere else.
SOURCES=/etc/apt/sources.list.d/debian.sources
[ -f "$SOURCES" ] || SOURCES=/etc/apt/sources.list
suite=$KUBE_DEBIAN_SUITE
mirrors=("$SOURCES")
major=$KUBE_PG_MAJOR

# Inputs of each image, hashed into its cache key.
case "$what" in
pause)
	name=$KUBE_IMAGE_PAUSE
	key() { gcc --version | head -1; cat "$repo/deploy/images/pause/pause.c"; }
	;;
postgres)
	name=$KUBE_IMAGE_POSTGRES
	# The extensions are the host's builds, built against the same Debian 12 PostgreSQL
	# headers; build them when missing (this also installs them on the host, as deps.sh does).
	DBCLOUD_EXT_KEEP_BUILD=1 "$here/extensions.sh" timescaledb "$KUBE_PG_MAJOR" >&2
	DBCLOUD_EXT_KEEP_BUILD=1 "$here/extensions.sh" pgvector "$KUBE_PG_MAJOR" >&2
	# dbcloud_guard, the library that keeps tenants inside their database (docs/security.md),
	# as installed on the host by scripts/guard.sh from this checkout's source.
	"$here/guard.sh" >&2
	guardlib="$(/usr/lib/postgresql/$KUBE_PG_MAJOR/bin/pg_config --pkglibdir)/dbcloud_guard.so"
	# shellcheck source=extensions.env
	. "$here/extensions.env"
	# Where extensions.sh keeps each build (its $dir), per PostgreSQL major version.
	extdirs=("${DBCLOUD_EXT_CACHE:-/var/cache/dbcloud/extensions}/timescaledb-$TIMESCALEDB_SRC_VERSION-pg$KUBE_PG_MAJOR/root"
		"${DBCLOUD_EXT_CACHE:-/var/cache/dbcloud/extensions}/pgvector-$PGVECTOR_SRC_VERSION-pg$KUBE_PG_MAJOR/root")
	key() {
		echo "$KUBE_DEBIAN_SUITE $KUBE_PG_MAJOR 2"
		cat "$SOURCES"
		find "${extdirs[@]}" -type f -print0 | sort -z | xargs -0 sha256sum
		sha256sum "$guardlib"
	}
	;;
postgres17)
	name=$KUBE_IMAGE_POSTGRES17
	major=17
	# shellcheck source=extensions.env
	. "$here/extensions.env"
	suite=$DBCLOUD_EXT_SUITE
	# The suite's own packages, pinned where scripts/postgresql.sh pins the host's, and from
	# the host's mirror the way that script reads it: the host runs the very same builds.
	pkgs17="postgresql-17=$POSTGRESQL17_VERSION,postgresql-17-pgvector=$PGVECTOR_SRC_VERSION"
	pkgs17+=",postgresql-17-timescaledb=$TIMESCALEDB_SRC_VERSION"
	keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	mirrors=("deb [signed-by=$keyring] $(debian_mirror) $suite main")
	security=$(debian_mirror security)
	[ -z "$security" ] || mirrors+=("deb [signed-by=$keyring] $security $suite-security main")
	# dbcloud_guard for 17 is built against the host's 17 (the same packages), so it needs it.
	"$here/postgresql.sh" 17 >&2
	"$here/guard.sh" 17 >&2
	guardlib="$(/usr/lib/postgresql/17/bin/pg_config --pkglibdir)/dbcloud_guard.so"
	key() {
		echo "$suite $pkgs17 1"
		printf '%s\n' "${mirrors[@]}"
		sha256sum "$guardlib"
	}
	;;
operator)
	name=$KUBE_IMAGE_OPERATOR
	bindir=$("$here/kube-build.sh" cnpg)
	key() { echo 1; sha256sum "$bindir/manager"; }
	;;
minio)
	name=$KUBE_IMAGE_MINIO
	bindir=$("$here/kube-build.sh" minio)
	key() { echo 1; sha256sum "$bindir/minio"; }
	;;
barman-plugin)
	name=$KUBE_IMAGE_BARMAN_PLUGIN
	bindir=$("$here/kube-build.sh" barman-cloud)
	key() { echo 1; sha256sum "$bindir/manager"; }
	;;
barman-sidecar)
	name=$KUBE_IMAGE_BARMAN_SIDECAR
	bindir=$("$here/kube-build.sh" barman-cloud)
	suite=$KUBE_BARMAN_SUITE
	keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	mirrors=("deb [signed-by=$keyring] $(debian_mirror) $suite main")
	security=$(debian_mirror security)
	[ -z "$security" ] || mirrors+=("deb [signed-by=$keyring] $security $suite-security main")
	key() { echo "$suite 1"; printf '%s\n' "${mirrors[@]}"; sha256sum "$bindir/manager"; }
	;;
pgbouncer)
	name=$KUBE_IMAGE_PGBOUNCER
	"$here/pgbouncer.sh" >&2
	# shellcheck source=extensions.env
	. "$here/extensions.env"
	bouncer="${DBCLOUD_PGBOUNCER_CACHE:-/var/cache/dbcloud/pgbouncer}/$PGBOUNCER_SRC_VERSION/pgbouncer"
	[ -x "$bouncer" ] || { log "no PgBouncer build at $bouncer"; exit 1; }
	key() { echo "$KUBE_DEBIAN_SUITE 1"; cat "$SOURCES"; sha256sum "$bouncer"; }
	;;
dbcloud)
	name=$KUBE_IMAGE_DBCLOUD
	# Always built (Go's build cache makes an unchanged checkout a relink), the image keyed by
	# the binary: no C library, so the root needs nothing else. In the cluster it talks to the
	# apiserver with the service account's CA and to its store in the cluster, so no system CA
	# certificates are needed; its schedules are UTC, so no time zone data.
	bin="$CACHE/.dbcloud-bin.$$"
	trap 'rm -f "$bin"' EXIT
	(cd "$repo" && CGO_ENABLED=0 go build -ldflags='-s -w' -o "$bin" ./cmd/dbcloud) >&2 || { log "go build failed"; exit 1; }
	key() { echo 1; sha256sum "$bin" | cut -d' ' -f1; }
	;;
*) log "unknown image"; exit 2 ;;
esac
PG_BIN=/usr/lib/postgresql/$major/bin
hash=$({ echo "$name"; key; } | sha256sum | cut -c1-16)
out="$CACHE/$what-$hash.tar"
[ -f "$out" ] && { echo "$out"; exit 0; }

exec 9>"$CACHE/.lock-$what"
flock 9
[ -f "$out" ] && { echo "$out"; exit 0; }

start=$(date +%s)
tmp=$(mktemp -d "$CACHE/.build-$what.XXXXXX")
trap 'rm -rf "$tmp" "${bin:-}"' EXIT
build_log "$tmp/build.log"

# archive LAYER_TAR CONFIG_JSON writes $out: a docker archive (manifest.json, the image
# config, one layer) tagged $name, the format `ctr images import` reads without a registry.
archive() {
	local layer=$1 config=$2 img="$tmp/img" diff cfg
	mkdir -p "$img"
	diff=$(sha256sum "$layer" | cut -d' ' -f1)
	mv "$layer" "$img/$diff.tar"
	printf '%s' "${config/@DIFF@/sha256:$diff}" >"$img/config.json"
	cfg=$(sha256sum "$img/config.json" | cut -d' ' -f1)
	mv "$img/config.json" "$img/$cfg.json"
	printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s.tar"]}]' "$cfg" "$name" "$diff" >"$img/manifest.json"
	tar --numeric-owner -C "$img" -cf "$tmp/out.tar" manifest.json "$cfg.json" "$diff.tar"
	mv "$tmp/out.tar" "$out"
}
# config ENTRYPOINT_JSON USER ENV_JSON prints an image config; @DIFF@ is the layer's digest.
config() {
	printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"User":"%s","Env":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["@DIFF@"]}}' "$1" "$2" "$3"
}
# layer_of DIR tars a directory as a layer owned by root.
layer_of() { tar --numeric-owner --owner=0 --group=0 -C "$1" -cf "$tmp/layer.tar" .; }

case "$what" in
pause)
	mkdir -p "$tmp/root"
	gcc -static -O2 -o "$tmp/root/pause" "$repo/deploy/images/pause/pause.c" >>"$buildlog" 2>&1 || fail "gcc failed"
	strip "$tmp/root/pause"
	layer_of "$tmp/root"
	archive "$tmp/layer.tar" "$(config '["/pause"]' 65535 '[]')"
	;;
operator)
	# The layout of CNPG's own image: the operator copies /manager into every instance pod
	# (its bootstrap init container), and it refuses "manager_<arch>" names it cannot find.
	mkdir -p "$tmp/root/operator" "$tmp/root/etc" "$tmp/root/tmp"
	chmod 1777 "$tmp/root/tmp"
	install -m 0755 "$bindir/manager" "$tmp/root/operator/manager_amd64"
	ln -s operator/manager_amd64 "$tmp/root/manager"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$tmp/root/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$tmp/root/etc/group"
	layer_of "$tmp/root"
	archive "$tmp/layer.tar" "$(config '["/manager"]' 65532 '["PATH=/usr/local/bin:/usr/bin:/bin"]')"
	;;
minio | barman-plugin)
	# Static Go binaries: a /tmp and the users their Deployments run as (65532).
	mkdir -p "$tmp/root/etc" "$tmp/root/tmp"
	chmod 1777 "$tmp/root/tmp"
	if [ "$what" = minio ]; then
		install -m 0755 "$bindir/minio" "$tmp/root/minio"
		entry='["/minio"]'
	else
		install -m 0755 "$bindir/manager" "$tmp/root/manager"
		entry='["/manager"]'
	fi
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$tmp/root/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$tmp/root/etc/group"
	layer_of "$tmp/root"
	archive "$tmp/layer.tar" "$(config "$entry" 65532 '["PATH=/usr/local/bin:/usr/bin:/bin"]')"
	;;
barman-sidecar)
	# The plugin runs the sidecar as uid 26 beside PostgreSQL (same volumes) and calls
	# barman-cloud-* from PATH; barman-cli-cloud only recommends boto3, the S3 client.
	build_deps mmdebstrap
	log "mmdebstrap $suite with barman-cli-cloud (log: $buildlog)"
	mmdebstrap --variant=minbase --include=barman-cli-cloud,python3-boto3 \
		--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--customize-hook="install -m 0755 $bindir/manager \"\$1/manager\"" \
		--customize-hook='chroot "$1" useradd -u 26 -M -d /var/lib/postgresql -s /usr/sbin/nologin postgres' \
		--customize-hook='chroot "$1" barman-cloud-wal-archive --version' \
		--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
		"$suite" "$tmp/layer.tar" "${mirrors[@]}" >>"$buildlog" 2>&1 || fail "mmdebstrap failed"
	archive "$tmp/layer.tar" "$(config '["/manager"]' 26 '["PATH=/usr/local/bin:/usr/bin:/bin","LANG=C.UTF-8"]')"
	;;
dbcloud)
	# The Deployment's user (65532) and a /tmp it mounts over (read-only root filesystem).
	mkdir -p "$tmp/root/etc" "$tmp/root/tmp"
	chmod 1777 "$tmp/root/tmp"
	install -m 0755 "$bin" "$tmp/root/dbcloud"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$tmp/root/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$tmp/root/etc/group"
	layer_of "$tmp/root"
	archive "$tmp/layer.tar" "$(config '["/dbcloud"]' 65532 '[]')"
	;;
postgres | postgres17 | pgbouncer)
	if [ "$what" != pgbouncer ]; then
		pkgs="postgresql-$major"
		# CNPG runs PostgreSQL as uid 26 (its images' postgres); gid 26 is Debian's tape
		# group, and CNPG sets the pod's group itself, so only the uid moves.
		hooks=(--customize-hook='chroot "$1" usermod -u 26 postgres'
			--customize-hook='chroot "$1" chown -R 26 /var/lib/postgresql /var/run/postgresql /var/log/postgresql /etc/postgresql')
		if [ "$what" = postgres ]; then
			for d in "${extdirs[@]}"; do hooks+=(--customize-hook="cp -a $d/. \"\$1\"/"); done
		else
			pkgs=$pkgs17
		fi
		hooks+=(--customize-hook="install -m 0755 $guardlib \"\$1$guardlib\"")
		# The 17 image's server starts with the guard and TimescaleDB preloaded: the guard is
		# built on the host (Debian 12's compiler, trixie's headers), and if trixie's server
		# cannot load it, that fails here, not in a pod.
		if [ "$what" = postgres17 ]; then
			cat >"$tmp/loadcheck.sh" <<EOF
set -e
d=\$(mktemp -d)
trap 'rm -rf "\$d"' EXIT
$PG_BIN/initdb -A trust -U postgres -D "\$d/data" >/dev/null
echo 'SELECT 1' | $PG_BIN/postgres --single -D "\$d/data" -c shared_preload_libraries=dbcloud_guard,timescaledb postgres >/dev/null
EOF
			hooks+=(--customize-hook="chroot --userspec=26:26 \"\$1\" sh <$tmp/loadcheck.sh")
		fi
		path="$PG_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
		user=26 entry='["'$PG_BIN'/postgres"]'
	else
		# Debian's package for its libraries, user and directories; CNPG runs /usr/bin/pgbouncer.
		pkgs="pgbouncer"
		hooks=(--customize-hook="install -m 0755 $bouncer \"\$1/usr/sbin/pgbouncer\""
			--customize-hook='ln -sf ../sbin/pgbouncer "$1/usr/bin/pgbouncer"')
		path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
		user=996 entry='["/usr/sbin/pgbouncer"]'
	fi
	build_deps mmdebstrap
	log "mmdebstrap $suite with $pkgs (log: $buildlog)"
	# The packaged cluster is not wanted (CNPG runs initdb), and docs, man pages and apt's
	# lists are dead weight in an image.
	mmdebstrap --variant=minbase --include="$pkgs" \
		--setup-hook='mkdir -p "$1/etc/postgresql-common/createcluster.d"; echo "create_main_cluster = false" >"$1/etc/postgresql-common/createcluster.d/dbcloud.conf"' \
		--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		"${hooks[@]}" \
		--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
		"$suite" "$tmp/layer.tar" "${mirrors[@]}" >>"$buildlog" 2>&1 || fail "mmdebstrap failed"
	if [ "$what" = pgbouncer ]; then
		user=$(tar -xOf "$tmp/layer.tar" ./etc/passwd | awk -F: '$1 == "postgres" { print $3 }')
	fi
	archive "$tmp/layer.tar" "$(config "$entry" "$user" '["PATH='"$path"'","LANG=C.UTF-8"]')"
	;;
esac
rm -rf "$tmp" "${bin:-}"
trap - EXIT
# Older builds of this image are never imported again: each changed input
# (dbcloud's binary changes with every commit) would otherwise leave one.
for old in "$CACHE/$what"-????????????????.tar; do
	[ "$old" = "$out" ] || rm -f "$old"
done
log "built in $(($(date +%s) - start)) s: $out"
echo "$out"
