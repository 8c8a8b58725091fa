#!/bin/bash
# rxe.sh - softrdma against Linux rdma_rxe, live, both ways, in the softrdma VM.
#
# Needs root and ../shared/softrdma-vm (built with its build-image.sh). Boots the VM twice
# on the private bridge in netns "softrdma" (host 10.77.0.1, VM 10.77.0.2): first the Linux
# tools serve and softrdma connects, then softrdma serves and the Linux tools connect.
# Every pairing is captured on the bridge to $OUT/<direction>-<test>.pcap and checked with
# `softrdma pcap check`. Prints one line per pairing: ok or FAILED.
# RAW=1: softrdma runs as a raw device instead (its own address 10.77.0.11 and MAC, on a
# veth joined to the bridge, frames through AF_PACKET or, with FRAME_IO=xdp, AF_XDP); the
# out-of-band exchange still uses the host's TCP on 10.77.0.1. Captures: raw-<...>.pcap.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VM=${SOFTRDMA_VM:-$REPO/../shared/softrdma-vm}
BIN=$REPO/target/release/softrdma
OUT=${OUT:-$REPO/pcaps/interop}
NS="ip netns exec softrdma"
mkdir -p "$OUT" /tmp/softrdma-interop
cp "$HERE/rxe-guest.sh" /tmp/softrdma-interop/
"$VM/net.sh" up 1 >/dev/null
# Leave no namespace, bridge or tap behind, even on failure (set KEEP_NET=1 to keep them).
trap '[ -n "${KEEP_NET:-}" ] || "$VM/net.sh" down >/dev/null 2>&1' EXIT
EXTRA=() PREFIX="" SELF=10.77.0.1
if [ -n "${RAW:-}" ]; then
    $NS ip link add srraw0 type veth peer name srraw1 2>/dev/null
    $NS ip link set srraw1 master srbr0 up && $NS ip link set srraw0 up
    EXTRA=(--iface srraw0 --ip 10.77.0.11/24 --frame-io "${FRAME_IO:-packet}") PREFIX=raw- SELF=10.77.0.11
fi

# name  softrdma-args  (ports as in rxe-guest.sh: base+0..7)
TESTS=(
  "rc_pingpong rc-pingpong -n 100 -s 4096"
  "write_bw write-bw -n 50 -s 8192"
  "read_bw read-bw -n 50 -s 8192"
  "send_bw send-bw -n 50 -s 8192"
  "write_lat write-lat -n 100 -s 64"
  "read_lat read-lat -n 100 -s 64"
  "send_lat send-lat -n 100 -s 64"
  "atomic_bw atomic-bw -n 50"
  "rping rping --transport rocev2 -C 10 -S 100 -V"
  "write_bw_cm write-bw -R -n 50 -s 8192"
  "read_bw_cm read-bw -R -n 50 -s 8192"
  "send_bw_cm send-bw -R -n 50 -s 8192"
  "write_lat_cm write-lat -R -n 100 -s 64"
  "read_lat_cm read-lat -R -n 100 -s 64"
  "send_lat_cm send-lat -R -n 100 -s 64"
  "atomic_bw_cm atomic-bw -R -n 50"
  "ud_pingpong ud-pingpong -n 100 -s 1024"
)
# rdma_cm cases (rping, -R): the RDMA address is the device's own (SELF), and rping names
# it with -a on both sides.
client_args() { # name args... -> the softrdma client's command line
    local name=$1; shift
    case $name in
        rping) echo "$@ -c -a 10.77.0.2" ;;
        *) echo "$@ 10.77.0.2" ;;
    esac
}
server_args() {
    local name=$1; shift
    case $name in
        rping) echo "$@ -s -a $SELF" ;;
        *_cm) echo "$@ --bind $SELF" ;;
        *) echo "$@" ;;
    esac
}

pair() { # direction base
    local dir=$1 base=$2 i=0
    for t in "${TESTS[@]}"; do
        set -- $t; local name=$1; shift
        local port=$((base + i)); i=$((i + 1))
        local pcap="$OUT/$PREFIX$dir-$name.pcap"
        rm -f "$pcap"
        $NS tcpdump --immediate-mode -B 32768 -i srbr0 -U -w "$pcap" "udp port 4791 or tcp port $port" 2>/dev/null & local dump=$!
        for _ in $(seq 50); do [ -s "$pcap" ] && break; sleep 0.1; done
        sleep 1
        local rc log=/tmp/softrdma-interop/$dir-$name.txt
        if [ "$dir" = rxe-serves ]; then
            for _ in $(seq 60); do
                timeout 90 $NS "$BIN" $(client_args "$name" "$@") -p $port "${EXTRA[@]}" >"$log" 2>&1; rc=$?
                [ $rc = 0 ] && break; sleep 1
            done
        else
            timeout 120 $NS "$BIN" $(server_args "$name" "$@") -p $port "${EXTRA[@]}" >"$log" 2>&1; rc=$?
        fi
        sleep 1; kill $dump 2>/dev/null; wait $dump 2>/dev/null
        local check; check=$("$BIN" pcap check -q "$pcap" | tail -1)
        local roce; roce=$("$BIN" pcap check --json "$pcap" | grep -o '"roce_packets": *[0-9]*' | tail -1 | grep -o '[0-9]*$')
        if [ $rc = 0 ] && [ "${roce:-0}" -gt 0 ] && "$BIN" pcap check -q "$pcap" >/dev/null; then
            echo "ok      $dir $name: $check"
        else
            echo "FAILED  $dir $name (rc=$rc): $check"; tail -3 "$log" | sed 's/^/        /'
        fi
    done
}

"$VM/boot.sh" --links rxe --offload off --share /tmp/softrdma-interop --run "bash /mnt/host/rxe-guest.sh server" \
    >/tmp/softrdma-interop/vm-server.log 2>&1 &
vm=$!
pair rxe-serves 18600
wait $vm
"$VM/boot.sh" --links rxe --offload off --share /tmp/softrdma-interop --run "bash /mnt/host/rxe-guest.sh client $SELF" \
    >/tmp/softrdma-interop/vm-client.log 2>&1 &
vm=$!
sleep 4
pair softrdma-serves 18700
wait $vm
grep -h "^=== .*rc=" /tmp/softrdma-interop/vm-*.log
