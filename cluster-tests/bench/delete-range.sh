#!/usr/bin/env bash
# One DeleteRange of many keys, as `etcdctl check perf` ends: a fresh three-member cluster takes
# TOTAL puts of distinct keys (KEY-byte keys, VAL-byte values, 256 clients of `rkube bench put`),
# then `etcdctl del "" --from-key` deletes them all in one request. One line per variant and
# round, the variants alternating: the client's time for the delete, the keys it deleted, and
# the largest member's peak RSS during the delete (VmHWM, reset just before it) and over the
# whole run. ROUNDS rounds (3).
#
# A variant is NAME=BINARY: an rkube binary, or etcd's when NAME is etcd or etcd-SUFFIX (then
# RKUBE names the rkube binary whose `up` makes the certificates and whose `bench put` loads
# both systems).
#
#   cluster-tests/bench/delete-range.sh NAME=BINARY [NAME=BINARY ...] > results.txt
#   WORK=DIR ROUNDS=3 TOTAL=220000 KEY=256 VAL=256 PORT=25379 (all optional)
set -u
WORK=${WORK:-$(mktemp -d)} ROUNDS=${ROUNDS:-3} PORT=${PORT:-25379}
TOTAL=${TOTAL:-220000} KEY=${KEY:-256} VAL=${VAL:-256}
VARIANTS=("$@")
RKUBE=${RKUBE:-${VARIANTS[0]#*=}}
RKUBE_UP_ARGS=()
ETCD_ARGS=()
# shellcheck source=cluster-lib.sh
. "$(dirname "$0")/cluster-lib.sh"
pki

for r in $(seq 1 "$ROUNDS"); do
  round_order "$r"
  for v in "${order[@]}"; do
    start_variant "$r" "$v" || continue
    "$RKUBE" bench --endpoints "$E" "${TLS[@]}" put --clients 256 --total "$TOTAL" --key-space "$TOTAL" \
      --key-size "$KEY" --val-size "$VAL" >"$d/load.log" 2>&1
    run_hwm=$(max_hwm)
    for m in 1 2 3; do echo 5 >"/proc/$(pid "$m")/clear_refs"; done
    t0=$(date +%s.%N)
    out=$(ctl --endpoints "$E" --command-timeout 120s del "" --from-key 2>&1 | tail -1)
    took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}')
    del_hwm=$(max_hwm)
    echo "round=$r variant=$name deleted=${out//[[:space:]]/_} delete_s=$took" \
      "delete_hwm_kib=$del_hwm run_hwm_kib=$((run_hwm > del_hwm ? run_hwm : del_hwm))"
    stop "$name" "$bin" "$d"
    [ -n "${KEEP:-}" ] || rm -rf "$d"
  done
done
