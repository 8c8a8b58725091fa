#!/bin/bash
# siw-guest.sh ROLE - the VM half of tests/interop/siw.sh (runs inside the softrdma VM).
#   ROLE = server: rping serves on 10.77.0.2, softrdma connects from 10.77.0.1
#   ROLE = client: softrdma serves on 10.77.0.1, rping connects
role=$1 host=10.77.0.1 me=10.77.0.2 T=60
echo "=== rping ($role)"
if [ "$role" = server ]; then
    timeout $T rping -s -v -C 5 -a $me -p 7174; rc=$?
else
    t0=$SECONDS
    while :; do
        timeout $T rping -c -v -C 5 -a $host -p 7175; rc=$?
        [ $rc = 0 ] || [ $((SECONDS - t0)) -ge $T ] && break
        sleep 1
    done
fi
echo "=== rping ($role): rc=$rc"
