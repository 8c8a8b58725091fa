#!/bin/bash
# siw-guest.sh ROLE [HOST] - the VM half of tests/interop/siw.sh (runs inside the VM).
#   ROLE = server: siw's rping and perftest -R serve on 10.77.0.2, softrdma connects
#   ROLE = client: softrdma serves on HOST (10.77.0.1), siw's tools connect (retrying until
#   it listens)
role=$1 host=${2:-10.77.0.1} me=10.77.0.2 T=90
run() { # name port command...
    local name=$1 port=$2; shift 2
    echo "=== $name ($role)"
    if [ "$role" = server ]; then
        timeout $T "$@"; rc=$?
    else
        t0=$SECONDS
        while :; do
            timeout $T "$@" $host; rc=$?
            [ $rc = 0 ] || [ $((SECONDS - t0)) -ge $T ] && break
            sleep 1
        done
    fi
    echo "=== $name ($role): rc=$rc"
}
if [ "$role" = server ]; then
    run rping 7174 rping -s -v -C 5 -a $me -p 7174
else
    run rping 7175 rping -c -v -C 5 -p 7175 -a
fi
run write_bw 18515 ib_write_bw -R -d siw0 -p 18515 -n 50 -s 8192 -F
run read_bw 18516 ib_read_bw -R -d siw0 -p 18516 -n 50 -s 8192 -F
run send_bw 18517 ib_send_bw -R -d siw0 -p 18517 -n 50 -s 8192 -F
run write_lat 18518 ib_write_lat -R -d siw0 -p 18518 -n 100 -s 64 -F
run read_lat 18519 ib_read_lat -R -d siw0 -p 18519 -n 100 -s 64 -F
run send_lat 18520 ib_send_lat -R -d siw0 -p 18520 -n 100 -s 64 -F
echo "=== guest done"
