#!/bin/bash
# rxe-guest.sh ROLE - the VM half of tests/interop/rxe.sh (runs inside the softrdma VM).
#   ROLE = server: the Linux tools serve, softrdma connects from 10.77.0.1
#   ROLE = client: softrdma serves on 10.77.0.1, the Linux tools connect
# Every test has its own port, so a late peer never pairs with the wrong test.
role=$1 host=10.77.0.1
G=$(rxe-gid rxe0); echo "rxe0 IPv4 RoCEv2 GID index: $G"
T=90
run() {
    local name=$1; shift
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
