#!/usr/bin/env bash
# Where a workload's CPU goes: each member's and the client's CPU time (user + system, from
# /proc/PID/stat and the client's rusage) divided by the operations done, on a fresh
# three-member cluster per round and variant, the variants alternating. One line per round and
# variant: the operations per second, the leader's and each follower's CPU per operation, the
# client's, their sum, and the largest member's peak RSS. A system that spends less CPU per
# operation leaves more of a small machine to the others: on two cores the three members and
# the client share what there is. The members' data dirs are removed after each run.
#
# A variant is NAME=BINARY: an rkube binary, or etcd's when NAME is etcd or etcd-SUFFIX (then
# RKUBE names the rkube binary whose `up` makes the certificates and whose `bench` is the
# client).
#
#   cluster-tests/bench/cpu-per-op.sh NAME=BINARY [NAME=BINARY ...] -- put --clients 1 --total 5000
#   cluster-tests/bench/cpu-per-op.sh NAME=BINARY [NAME=BINARY ...] -- checkperf
#
# After `--`: the arguments of `rkube bench` (sent to the leader's endpoint alone unless they
# say otherwise), or `checkperf` for `etcdctl check perf --load=CHECKPERF_LOAD` over all three
# endpoints (its writes per second times its 60 s are the operations).
#   WORK=DIR ROUNDS=3 PORT=27379 CHECKPERF_LOAD=l (all optional)
set -u
WORK=${WORK:-$(mktemp -d)} ROUNDS=${ROUNDS:-3} PORT=${PORT:-27379} CHECKPERF_LOAD=${CHECKPERF_LOAD:-l}
VARIANTS=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do VARIANTS+=("$1"); shift; done
[ $# -gt 1 ] || { echo "usage: $0 NAME=BINARY ... -- BENCH ARGS | checkperf" >&2; exit 2; }
shift
WORKLOAD=("$@")
RKUBE=${RKUBE:-${VARIANTS[0]#*=}}
RKUBE_UP_ARGS=()
ETCD_ARGS=()
# shellcheck source=cluster-lib.sh
. "$(dirname "$0")/cluster-lib.sh"
pki

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

for r in $(seq 1 "$ROUNDS"); do
  round_order "$r"
  for v in "${order[@]}"; do
    start_variant "$r" "$v" || continue
    lead=$(leader "$E")
    t0=()
    for m in 1 2 3; do t0[$m]=$(ticks "$(pid "$m")"); done
    if [ "${WORKLOAD[0]}" = checkperf ]; then
      /usr/bin/time -f "client_cpu_s=%U+%S" -o "$d/client.time" env ETCDCTL_API=3 etcdctl \
        --endpoints "$E" "${TLS[@]}" check perf --load="$CHECKPERF_LOAD" >"$d/client.out" 2>&1
      ops_s=$(tr '\r' '\n' <"$d/client.out" | grep -o 'Throughput[^0-9]*[0-9]*' | grep -o '[0-9]*$')
      ops=$((${ops_s:-0} * 60))
    else
      /usr/bin/time -f "client_cpu_s=%U+%S" -o "$d/client.time" "$RKUBE" bench \
        --endpoints "$(echo "$E" | cut -d, -f"$lead")" "${TLS[@]}" "${WORKLOAD[@]}" >"$d/client.out" 2>&1
      ops=$(grep -o 'samples=[0-9]*' "$d/client.out" | tail -1 | cut -d= -f2)
      ops_s=$(grep -o 'throughput=[0-9]*' "$d/client.out" | tail -1 | cut -d= -f2)
    fi
    client=$(grep -o 'client_cpu_s=[0-9.+]*' "$d/client.time" | cut -d= -f2 | bc)
    line="round=$r variant=$name ops=${ops:-0}"
    if [ "${ops:-0}" -gt 0 ]; then
      sum=0 follower=0
      for m in 1 2 3; do
        us=$(( ($(ticks "$(pid "$m")") - t0[$m]) * 1000000 / hz / ops ))
        sum=$((sum + us))
        if [ "$m" = "$lead" ]; then line="$line leader_us=$us"; else
          follower=$((follower + 1)); line="$line follower${follower}_us=$us"; fi
      done
      c=$(echo "$client * 1000000 / $ops" | bc)
      line="$line ops_per_s=$ops_s client_us=$c all_us=$((sum + c)) peak_rss_kb=$(max_hwm)"
    else
      line="$line error=$(tail -1 "$d/client.out" | tr ' ' _)"
    fi
    echo "$line"
    stop "$name" "$bin" "$d"
    # The members' data (a check perf run leaves about 3.5 GiB of it); their logs stay.
    find "$d" -mindepth 1 -maxdepth 1 -type d -name '[ne][0-9]' -exec rm -rf {} +
  done
done
