#!/bin/bash
# What a clone costs on btrfs as more subvolumes share the blocks (runtime/local/postgres
# template_copies.go): entries are subvolumes with a template's files cloned in, as the pool's
# entries are, and every 50th entry clones its own files again and syncs, as a service's first
# snapshot does. Prints that clone's time and the total so far.
#
#   bench/btrfs-fanout.sh qgroups 300      quota groups, every entry cloned from one template
#   bench/btrfs-fanout.sh copies 300       quota groups, a byte copy of the template every 32
#   bench/btrfs-fanout.sh simple 300       simple quotas (kernel 6.7+), one template
#
# As root; uses a 20 GiB sparse image under /tmp, removed at the end.
set -eu
mode=${1:?usage: btrfs-fanout.sh qgroups|copies|simple [ENTRIES]}
n=${2:-300}
d=$(mktemp -d /tmp/btrfs-fanout.XXXXXX)
img=$d.img
cleanup() { umount "$d" 2>/dev/null || true; rm -rf "$d" "$img"; }
trap cleanup EXIT
truncate -s 20G "$img"
mkfs.btrfs -q "$img"
mount -o loop,commit=5 "$img" "$d"
case "$mode" in
qgroups | copies) btrfs quota enable "$d" ;;
# BTRFS_IOC_QUOTA_CTL with BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA: Debian 12's btrfs-progs has no option for it.
simple) python3 -c "import fcntl,os,struct; fcntl.ioctl(os.open('$d',os.O_RDONLY),0xC0109428,struct.pack('QQ',4,0))" ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac
mkdir "$d/template"
for i in $(seq 1 1200); do head -c 32768 /dev/urandom >"$d/template/f$i"; done
src=$d/template
sync
t0=$(date +%s.%N)
for i in $(seq 1 "$n"); do
	if [ "$mode" = copies ] && [ $((i % 32)) -eq 1 ]; then
		mkdir "$d/copy$i"
		cp --reflink=never "$d"/template/f* "$d/copy$i/"
		[ "$src" = "$d/template" ] || rm -rf "$src"
		src=$d/copy$i
	fi
	btrfs subvolume create "$d/s$i" >/dev/null
	cp --reflink=always "$src"/f* "$d/s$i/"
	sync -f "$d/s$i"
	if [ $((i % 50)) -eq 0 ]; then
		a=$(date +%s.%N)
		mkdir "$d/s$i/snap"
		cp --reflink=always "$d/s$i"/f* "$d/s$i/snap/"
		sync -f "$d/s$i"
		b=$(date +%s.%N)
		echo "$mode: $i entries: clone and sync $(echo "$b - $a" | bc) s; $(echo "$b - $t0" | bc) s in all"
	fi
done
