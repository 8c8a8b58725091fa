#!/bin/bash
# interop/image.sh - the peer VM for interop/run: Debian's own kernel with rdma_rxe, siw
# built from Debian's kernel source (Debian configures it out), and rdma-core, perftest
# and rping from Debian's packages, in one initramfs. Nothing is installed on the host
# but the build tools; the kernel package is unpacked, never installed.
#
# Output: $CACHE/vmlinuz, $CACHE/initramfs.cpio.gz (CACHE defaults to
# /var/tmp/softrdma-interop). Re-running reuses every download and build it can.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${INTEROP_CACHE:-/var/tmp/softrdma-interop}
say() { echo "[interop/image] $*" >&2; }

KVER=${KVER:-$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: linux-image-\([0-9].*\)/\1/p' | head -1)}
SERIES=${KVER%%-*}; SERIES=${SERIES%.*}
NEED="qemu-system-x86 busybox-static ibverbs-utils ibverbs-providers rdma-core perftest rdmacm-utils
      iproute2 tcpdump cpio kmod xz-utils gcc make bc linux-perf linux-headers-$KVER"
missing=$(for p in $NEED; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"; done)
if [ -n "$missing" ]; then
    say "installing $(echo $missing)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing >&2
fi
mkdir -p "$CACHE/debs"
chmod 755 "$CACHE" "$CACHE/debs"

fetch() { # package -> path of its .deb in the cache
    local f; f=$(ls "$CACHE/debs/$1"_*.deb 2>/dev/null | head -1 || true)
    if [ -z "$f" ]; then
        (cd "$CACHE/debs" && apt-get download "$1" >&2)
        f=$(ls "$CACHE/debs/$1"_*.deb | head -1)
    fi
    echo "$f"
}

KDIR=$CACHE/kernel-$KVER
if [ ! -e "$KDIR/boot/vmlinuz-$KVER" ]; then
    say "unpacking linux-image-$KVER"
    mkdir -p "$KDIR" && dpkg-deb -x "$(fetch "linux-image-$KVER")" "$KDIR"
fi
MODS=$KDIR/lib/modules/$KVER

# siw: Debian's config says "CONFIG_RDMA_SIW is not set"; its source is in linux-source.
if ! grep -q '^CONFIG_RDMA_SIW=[ym]' "$KDIR/boot/config-$KVER" && [ ! -e "$MODS/extra/siw.ko" ]; then
    SRC=$CACHE/siw-$KVER
    if [ ! -e "$SRC/siw.ko" ]; then
        say "building siw.ko from linux-source-$SERIES"
        rm -rf "$SRC" && mkdir -p "$SRC"
        dpkg-deb --fsys-tarfile "$(fetch "linux-source-$SERIES")" |
            tar -xO "./usr/src/linux-source-$SERIES.tar.xz" | xz -dc |
            tar -x -C "$SRC" --strip-components=5 --wildcards "linux-source-$SERIES/drivers/infiniband/sw/siw/*"
        make -s -C "/usr/src/linux-headers-$KVER" M="$SRC" CONFIG_RDMA_SIW=m modules >&2
        strip --strip-debug "$SRC/siw.ko"
    fi
    mkdir -p "$MODS/extra" && cp "$SRC/siw.ko" "$MODS/extra/"
fi
depmod -b "$KDIR" "$KVER"

ROOT=$CACHE/root
rm -rf "$ROOT"
mkdir -p "$ROOT"/{bin,dev,proc,sys,tmp,mnt/host,etc,root,usr/bin,usr/sbin,usr/lib,usr/lib64}
ln -s usr/lib "$ROOT/lib"; ln -s usr/lib64 "$ROOT/lib64"
cp /bin/busybox "$ROOT/bin/"

# Modules in load order (modprobe's dependency closure), listed for the guest's init.
: > "$ROOT/etc/modules"
# rxe asks the crypto API for "crc32" (ICRC), siw for "crc32c" (MPA CRC).
for m in virtio_pci virtio_net 9pnet_virtio 9p crc32_generic crc32-pclmul crc32c_generic crc32c-intel libcrc32c sch_netem \
         ib_core ib_uverbs ib_cm iw_cm rdma_cm rdma_ucm rdma_rxe siw; do
    modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" 2>/dev/null | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
    rel=${ko#"$KDIR"}
    mkdir -p "$ROOT/usr$(dirname "$rel")" && cp "$ko" "$ROOT/usr$rel"
    echo "$rel" >> "$ROOT/etc/modules"
done

# Programs and every library they load (ldd), plus the providers libibverbs opens.
place() { # a host file at its usr-merged path in the image (and its name, if a link)
    local real; real=$(readlink -f "$1")
    case $real in /lib/*|/lib64/*|/bin/*|/sbin/*) real=/usr$real ;; esac
    mkdir -p "$ROOT$(dirname "$real")" && cp -n "$(readlink -f "$1")" "$ROOT$real"
    local name=$1; case $name in /lib/*|/lib64/*) name=/usr$name ;; esac
    [ "$name" = "$real" ] || [ -e "$ROOT$name" ] || { mkdir -p "$ROOT$(dirname "$name")"; ln -s "$real" "$ROOT$name"; }
}
LIBDIR=/usr/lib/x86_64-linux-gnu
for f in ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong rping ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw \
         ib_write_lat ib_read_lat ib_send_lat ucmatose udaddy mckey rdma_server rdma_client rstream riostream udpong rdma ip tc bash timeout perf; do
    f=$(command -v "$f" || ls /usr/sbin/"$f" /sbin/"$f" 2>/dev/null | head -1)
    for g in "$f" $(ldd "$f" | awk '$3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do place "$g"; done
done
for f in "$LIBDIR"/libibverbs/librxe-rdmav*.so "$LIBDIR"/libibverbs/libsiw-rdmav*.so "$LIBDIR"/libgcc_s.so.1; do
    place "$f"
done
mkdir -p "$ROOT/etc/libibverbs.d"
cp /etc/libibverbs.d/rxe.driver /etc/libibverbs.d/siw.driver "$ROOT/etc/libibverbs.d/"
echo "root:x:0:0:root:/root:/bin/sh" > "$ROOT/etc/passwd"
install -m 755 "$HERE/guest/init" "$ROOT/init"

cp "$KDIR/boot/vmlinuz-$KVER" "$CACHE/vmlinuz"
(cd "$ROOT" && find . | cpio -o -H newc --owner 0:0 --quiet) | gzip -5 > "$CACHE/initramfs.cpio.gz"
say "kernel $KVER: $CACHE/vmlinuz, $CACHE/initramfs.cpio.gz ($(du -h "$CACHE/initramfs.cpio.gz" | cut -f1))"
