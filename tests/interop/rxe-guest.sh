#!/bin/bash
# rxe-guest.sh ROLE - the VM half of tests/interop/rxe.sh (runs inside the softrdma VM).
#   ROLE = server: the Linux tools serve, softrdma connects from 10.77.0.1
#   ROLE = client: softrdma serves on 10.77.0.1, the Linux tools connect
#   CMHOST: the address softrdma's rdma_cm cases serve on (10.77.0.1, or a raw device's)
# Every test has its own port, so a late peer never pairs with the wrong test.
role=$1 host=10.77.0.1 cmhost=${2:-10.77.0.1}
G=$(rxe-gid rxe0); echo "rxe0 IPv4 RoCEv2 GID index: $G"
T=90
run() {
    local name=$1; shift
    case $name in *_cm) [ "$role" = client ] && host=$cmhost ;; *) host=10.77.0.1 ;; esac
    echo "=== $name ($role): $*"
    local t0=$SECONDS rc
    if [ "$role" = server ]; then
        timeout "$T" "$@"; rc=$?
    else
        while :; do
            timeout "$T" "$@" "$host"; rc=$?
            [ $rc = 0 ] || [ $((SECONDS - t0)) -ge $T ] && break
            sleep 1
        done
    fi
    echo "=== $name ($role): rc=$rc"
}
base=18600; [ "$role" = client ] && base=18700
run rc_pingpong ibv_rc_pingpong -d rxe0 -g "$G" -p $base -n 100 -s 4096
run write_bw    ib_write_bw  -d rxe0 -x "$G" -p $((base + 1)) -n 50 -s 8192 -F
run read_bw     ib_read_bw   -d rxe0 -x "$G" -p $((base + 2)) -n 50 -s 8192 -F
run send_bw     ib_send_bw   -d rxe0 -x "$G" -p $((base + 3)) -n 50 -s 8192 -F
run write_lat   ib_write_lat -d rxe0 -x "$G" -p $((base + 4)) -n 100 -s 64 -F
run read_lat    ib_read_lat  -d rxe0 -x "$G" -p $((base + 5)) -n 100 -s 64 -F
run send_lat    ib_send_lat  -d rxe0 -x "$G" -p $((base + 6)) -n 100 -s 64 -F
run atomic_bw   ib_atomic_bw -d rxe0 -x "$G" -p $((base + 7)) -n 50 -F
# rdma_cm: rping names the address with -a on both sides; perftest -R as above.
rping_run() {
    local port=$1
    echo "=== rping ($role): port $port"
    local t0=$SECONDS rc
    if [ "$role" = server ]; then
        timeout "$T" rping -s -a 10.77.0.2 -p "$port" -C 10 -S 100 -V; rc=$?
    else
        while :; do
            timeout "$T" rping -c -a "$cmhost" -p "$port" -C 10 -S 100 -V; rc=$?
            [ $rc = 0 ] || [ $((SECONDS - t0)) -ge $T ] && break
            sleep 1
        done
    fi
    echo "=== rping ($role): rc=$rc"
}
rping_run $((base + 8))
run write_bw_cm  ib_write_bw  -R -d rxe0 -p $((base + 9)) -n 50 -s 8192 -F
run read_bw_cm   ib_read_bw   -R -d rxe0 -p $((base + 10)) -n 50 -s 8192 -F
run send_bw_cm   ib_send_bw   -R -d rxe0 -p $((base + 11)) -n 50 -s 8192 -F
run write_lat_cm ib_write_lat -R -d rxe0 -p $((base + 12)) -n 100 -s 64 -F
run read_lat_cm  ib_read_lat  -R -d rxe0 -p $((base + 13)) -n 100 -s 64 -F
run send_lat_cm  ib_send_lat  -R -d rxe0 -p $((base + 14)) -n 100 -s 64 -F
run atomic_bw_cm ib_atomic_bw -R -d rxe0 -p $((base + 15)) -n 50 -F
run ud_pingpong  ibv_ud_pingpong -d rxe0 -g "$G" -p $((base + 16)) -n 100 -s 1024
