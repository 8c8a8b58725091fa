#!/bin/bash
# siw.sh - softrdma rping against Linux siw's rping, live, both ways, MPA CRC off and on.
#
# Needs root and ../shared/softrdma-vm (built with its build-image.sh). Boots the VM with
# siw only (rdma_cm would pick rxe otherwise), first with siw's defaults (no CRC), then
# with mpa_crc_required=1; each time rping serves in the VM and softrdma connects, then
# softrdma serves and rping connects. softrdma never opens a bare TCP connection to siw's
# listener (the siw 6.1 listener bug): it speaks MPA as soon as it is connected. Each
# pairing is captured on the bridge into $OUT/siw-<crc>-<direction>.pcap and checked.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VM=${SOFTRDMA_VM:-$REPO/../shared/softrdma-vm}
BIN=$REPO/target/release/softrdma
OUT=${OUT:-$REPO/pcaps/interop}
NS="ip netns exec softrdma"
mkdir -p "$OUT" /tmp/softrdma-interop
cp "$HERE/siw-guest.sh" /tmp/softrdma-interop/
"$VM/net.sh" up 1 >/dev/null
# Leave no namespace, bridge or tap behind, even on failure (set KEEP_NET=1 to keep them).
trap '[ -n "${KEEP_NET:-}" ] || "$VM/net.sh" down >/dev/null 2>&1' EXIT

one() { # crc-name siw-opts role(of the VM)
    local name=$1 opts=$2 role=$3 dir port ours=request
    # With CRC "on", both sides ask for it: siw's mpa_crc_required governs what siw asks.
    [ "$name" = on ] && ours=required
    if [ "$role" = server ]; then dir=siw-serves port=7174; else dir=softrdma-serves port=7175; fi
    local pcap="$OUT/siw-$name-$dir.pcap" log=/tmp/softrdma-interop/siw-$name-$dir.txt
    local args=(--links siw --offload off --share /tmp/softrdma-interop --run "bash /mnt/host/siw-guest.sh $role")
    [ -n "$opts" ] && args+=(--siw-opts "$opts")
    "$VM/boot.sh" "${args[@]}" >/tmp/softrdma-interop/vm-siw-$name-$dir.log 2>&1 & local vm=$!
    # Capture once the VM's tap is on the bridge (attaching it disturbs a running capture).
    sleep 6
    rm -f "$pcap"
    $NS tcpdump -i srtap1 -U -w "$pcap" "tcp port $port" 2>/dev/null & local dump=$!
    for _ in $(seq 50); do [ -s "$pcap" ] && break; sleep 0.1; done
    sleep 3
    local rc
    if [ "$role" = server ]; then
        for _ in $(seq 60); do
            timeout 60 $NS "$BIN" rping -c -a 10.77.0.2 -p $port -C 5 -v -V --crc "$ours" >"$log" 2>&1; rc=$?
            [ $rc = 0 ] && break; sleep 1
        done
    else
        timeout 120 $NS "$BIN" rping -s -a 10.77.0.1 -p $port -v --crc "$ours" >"$log" 2>&1; rc=$?
    fi
    wait $vm
    sleep 0.5; kill $dump 2>/dev/null; wait $dump 2>/dev/null
    local vmrc; vmrc=$(grep -o "=== rping ([a-z]*): rc=[0-9]*" /tmp/softrdma-interop/vm-siw-$name-$dir.log | tail -1)
    local check; check=$("$BIN" pcap check -q "$pcap" | tail -1)
    local fpdus; fpdus=$("$BIN" pcap check --json "$pcap" | grep -o '"fpdus": *[0-9]*' | tail -1 | grep -o '[0-9]*$')
    if [ $rc = 0 ] && [ "${vmrc##*=}" = 0 ] && [ "${fpdus:-0}" -gt 0 ] && "$BIN" pcap check -q "$pcap" >/dev/null; then
        echo "ok      siw crc=$name $dir: $check"
    else
        echo "FAILED  siw crc=$name $dir (softrdma rc=$rc, vm: $vmrc): $check"; tail -3 "$log" | sed 's/^/        /'
    fi
}

# Arguments: the CRC settings to run (default: off on).
for crc in "${@:-off on}"; do
    for c in $crc; do
        opts=""; [ "$c" = on ] && opts=mpa_crc_required=1
        for role in ${ROLES:-server client}; do
            one "$c" "$opts" "$role"
        done
    done
done
