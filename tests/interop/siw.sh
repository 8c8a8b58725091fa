#!/bin/bash
# siw.sh - softrdma against Linux siw, live: rping, and ib_write_bw / ib_read_bw /
# ib_send_bw / ib_write_lat / ib_read_lat / ib_send_lat with -R (rdma_cm), both ways, MPA
# CRC off and on.
#
# Needs root and ../shared/softrdma-vm (built with its build-image.sh). Boots the VM with
# siw only (rdma_cm would pick rxe otherwise), first with siw's defaults (no CRC), then
# with mpa_crc_required=1; each time siw's tools serve in the VM and softrdma connects,
# then softrdma serves and siw's tools connect. softrdma never opens a bare TCP
# connection to siw's listener (the siw 6.1 listener bug): it speaks MPA as soon as it is
# connected. Each boot is captured on the bridge; each pairing's traffic (by port) goes
# to $OUT/siw-<crc>-<who serves>[-<tool>].pcap and is checked with `softrdma pcap check`.
# RAW=1: softrdma runs iWARP on its own TCP (smoltcp) over raw Ethernet, at 10.77.0.11 on a
# veth joined to the bridge. Captures: raw-siw-....
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VM=${SOFTRDMA_VM:-$REPO/../shared/softrdma-vm}
BIN=$REPO/target/release/softrdma
OUT=${OUT:-$REPO/pcaps/interop}
WORK=/tmp/softrdma-interop
NS="ip netns exec softrdma"
mkdir -p "$OUT" $WORK
cp "$HERE/siw-guest.sh" $WORK/
"$VM/net.sh" up 1 >/dev/null
# Leave no namespace, bridge or tap behind, even on failure (set KEEP_NET=1 to keep them).
trap '[ -n "${KEEP_NET:-}" ] || "$VM/net.sh" down >/dev/null 2>&1' EXIT
EXTRA=() PREFIX="" HOSTIP=10.77.0.1
TOOLS="rping:7174 write_bw:18515 read_bw:18516 send_bw:18517 write_lat:18518 read_lat:18519 send_lat:18520"
if [ -n "${RAW:-}" ]; then
    $NS ip link add srraw0 type veth peer name srraw1 2>/dev/null
    $NS ip link set srraw1 master srbr0 up && $NS ip link set srraw0 up
    EXTRA=(--iface srraw0 --ip 10.77.0.11/24) PREFIX=raw- HOSTIP=10.77.0.11
fi

# The host half of one pairing; retries while the VM side is not listening yet.
host_side() { # role tool port crc log
    local role=$1 tool=$2 port=$3 crc=$4 log=$5 cmd rc=1
    local size=(-n 50 -s 8192); [[ "$tool" = *_lat ]] && size=(-n 100 -s 64)
    local perf=("${size[@]}" --transport iwarp --mpa-crc "$crc" -p "$port" "${EXTRA[@]}")
    case "$tool" in
        rping) if [ "$role" = server ]; then cmd=(rping -c -a 10.77.0.2 -p "$port" -C 5 -v -V --crc "$crc" "${EXTRA[@]}")
               else cmd=(rping -s -a "$HOSTIP" -p "$port" -v --crc "$crc" "${EXTRA[@]}"); fi ;;
        *)     cmd=("${tool/_/-}" "${perf[@]}"); [ "$role" = server ] && cmd+=(10.77.0.2) ;;
    esac
    local t0=$SECONDS
    while :; do
        timeout 90 $NS "$BIN" "${cmd[@]}" >"$log" 2>&1; rc=$?
        [ $rc = 0 ] || [ "$role" = client ] || [ $((SECONDS - t0)) -ge 60 ] && break
        sleep 1
    done
    return $rc
}

boot() { # crc-name siw-opts role(of the VM)
    local name=$1 opts=$2 role=$3 dir ours=request
    # With CRC "on", both sides ask for it: siw's mpa_crc_required governs what siw asks.
    [ "$name" = on ] && ours=required
    if [ "$role" = server ]; then dir=siw-serves; else dir=softrdma-serves; fi
    local all=$WORK/${PREFIX}siw-$name-$dir-all.pcap vmlog=$WORK/vm-siw-$name-$dir.log
    local args=(--links siw --offload off --share $WORK --run "bash /mnt/host/siw-guest.sh $role $HOSTIP")
    [ -n "$opts" ] && args+=(--siw-opts "$opts")
    "$VM/boot.sh" "${args[@]}" >"$vmlog" 2>&1 & local vm=$!
    # Capture once the VM's tap is on the bridge (attaching it disturbs a running capture).
    sleep 6
    rm -f "$all"
    $NS tcpdump --immediate-mode -B 32768 -i srbr0 -U -w "$all" tcp 2>/dev/null & local dump=$!
    for _ in $(seq 50); do [ -s "$all" ] && break; sleep 0.1; done
    sleep 1
    local results=()
    for pair in $TOOLS; do
        [ "$role" = client ] && pair=${pair/7174/7175}
        local tool=${pair%%:*} port=${pair##*:}
        host_side "$role" "$tool" "$port" "$ours" "$WORK/siw-$name-$dir-$tool.txt"
        results+=("$tool:$port:$?")
    done
    wait $vm
    sleep 0.5; kill $dump 2>/dev/null; wait $dump 2>/dev/null
    for r in "${results[@]}"; do
        IFS=: read -r tool port rc <<<"$r"
        local pcap="$OUT/${PREFIX}siw-$name-$dir-$tool.pcap"
        [ "$tool" = rping ] && pcap="$OUT/${PREFIX}siw-$name-$dir.pcap"
        tcpdump -r "$all" -w "$pcap" "tcp port $port" 2>/dev/null
        local vmrc; vmrc=$(grep -o "=== $tool ([a-z]*): rc=[0-9]*" "$vmlog" | tail -1)
        local check; check=$("$BIN" pcap check -q "$pcap" | tail -1)
        local fpdus; fpdus=$("$BIN" pcap check --json "$pcap" | grep -o '"fpdus": *[0-9]*' | tail -1 | grep -o '[0-9]*$')
        if [ "$rc" = 0 ] && [ "${vmrc##*=}" = 0 ] && [ "${fpdus:-0}" -gt 0 ] && "$BIN" pcap check -q "$pcap" >/dev/null; then
            echo "ok      siw crc=$name $dir $tool: $check"
        else
            echo "FAILED  siw crc=$name $dir $tool (softrdma rc=$rc, vm: $vmrc): $check"
            tail -3 "$WORK/siw-$name-$dir-$tool.txt" | sed 's/^/        /'
        fi
    done
}

# Arguments: the CRC settings to run (default: off on).
for crc in "${@:-off on}"; do
    for c in $crc; do
        opts=""; [ "$c" = on ] && opts=mpa_crc_required=1
        for role in ${ROLES:-server client}; do
            boot "$c" "$opts" "$role"
        done
    done
done
