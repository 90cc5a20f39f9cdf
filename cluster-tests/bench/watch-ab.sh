#!/usr/bin/env bash
# Two rkube binaries against each other on the watch workload of vs-etcd.sh: 1,000 watchers (100
# streams over 10 connections to all members) on one key while puts go to the leader at 1,000/s
# for 10 s. Each run has a fresh three-member `rkube up --store-only` cluster; the two alternate
# which goes first, ROUNDS rounds (5). One line per run: put rate, event latency p50/p99, and the
# CPU ticks (1/100 s) the three members used during the run.
#
#   cluster-tests/bench/watch-ab.sh NAME_A=SERVER_A[,CLIENT_A] NAME_B=SERVER_B[,CLIENT_B] > results.txt
#
# SERVER runs the cluster and CLIENT (SERVER when left out) runs `rkube bench watch-latency`, so
# a change to the bench client can be compared against the same servers. Loopback only.
set -u
A=$1 B=$2 ROUNDS=${ROUNDS:-5} PORT=${PORT:-57379}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for r in $(seq 1 "$ROUNDS"); do
  order="$A $B"; [ $((r % 2)) = 0 ] && order="$B $A"
  for v in $order; do
    name=${v%%=*} bins=${v#*=}
    server=${bins%%,*} client=${bins#*,}
    d=$WORK/$name
    rm -rf "$d"; mkdir -p "$d"
    if ! timeout 120 "$server" up --dir "$d" --base-port "$PORT" --store-only --detach >/dev/null 2>&1; then
      echo "round=$r variant=$name error=up-failed"; timeout 60 "$server" down --dir "$d" >/dev/null 2>&1; continue
    fi
    pids=$(for f in "$d"/n?.pid; do cat "$f"; echo; done)
    declare -A before=()
    for p in $pids; do before[$p]=$(ticks "$p"); done
    out=$("$client" bench --dir "$d" watch-latency --watchers 1000 --streams 100 --connections 10 \
      --rate 1000 2>&1 | grep -v BENCH_JSON | tail -1)
    used=0
    for p in $pids; do used=$((used + $(ticks "$p") - before[$p])); done
    echo "round=$r variant=$name $(grep -oE '(put_rate|p50_ms|p99_ms)=[0-9.]+' <<<"$out" | paste -sd' ') member_ticks=$used"
    timeout 60 "$server" down --dir "$d" >/dev/null 2>&1
  done
done
