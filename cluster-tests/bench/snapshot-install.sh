#!/usr/bin/env bash
# Memory of a Raft snapshot's trip: a follower is stopped, the leader takes TOTAL puts (values of
# VAL bytes, all distinct keys) and snapshots after every 1,000 entries, purging the log behind
# it, then the follower starts again and catches up from a snapshot. One line per variant and
# round, the variants alternating: the leader's snapshot size, whether the follower caught up and
# how long that took from its start (and, within it, how long until the follower's endpoint
# status first answered naming a leader), the follower's peak RSS (VmHWM since its start) and
# the leader's (reset just before the follower starts, so it covers the send). ROUNDS rounds (3).
#
# A variant is NAME=BINARY: an rkube binary, or etcd's when NAME is etcd or etcd-SUFFIX (then
# RKUBE names the rkube binary whose `up` makes the certificates and whose `bench put` loads
# both systems).
#
#   cluster-tests/bench/snapshot-install.sh NAME=BINARY [NAME=BINARY ...] > results.txt
#   WORK=DIR ROUNDS=3 TOTAL=200000 VAL=1024 PORT=25379 (all optional)
#   PERF_S=SECONDS: `perf record -a` of the whole machine for that long from the follower's
#   start, into WORK/perf-rROUND-NAME.data (kept; read it with `perf report -i`).
set -u
WORK=${WORK:-$(mktemp -d)} ROUNDS=${ROUNDS:-3} PORT=${PORT:-25379}
TOTAL=${TOTAL:-200000} VAL=${VAL:-1024}
VARIANTS=("$@")
RKUBE=${RKUBE:-${VARIANTS[0]#*=}}

RKUBE_UP_ARGS=(--snapshot-count 1000 --snapshot-catchup-entries 100)
ETCD_ARGS=(--snapshot-count 1000)
# shellcheck source=cluster-lib.sh
. "$(dirname "$0")/cluster-lib.sh"
pki

# installs NAME BASE N: snapshots member N received since its start (its metrics).
installs() {
  curl -sf "http://127.0.0.1:$(($2 + 10 * ($3 - 1) + 2))/metrics" |
    awk -v m="$(is_etcd "$1" && echo etcd_network_snapshot_receive_success || echo rkube_raft_snapshot_installs)" \
      '$1 == m || index($1, m "{") == 1 {s += $2} END {print s + 0}'
}

# since T: seconds (one decimal) from T, a `date +%s.%N` reading, until now.
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }

for r in $(seq 1 "$ROUNDS"); do
  round_order "$r"
  for v in "${order[@]}"; do
    start_variant "$r" "$v" || continue
    l=$(leader "$E"); f=$((l % 3 + 1))
    kill -9 "$(pid "$f")"
    "$RKUBE" bench --endpoints "$E" "${TLS[@]}" put --clients 64 --total "$TOTAL" --key-space "$TOTAL" \
      --val-size "$VAL" --key-size 32 >"$d/load.log" 2>&1
    # The leader's newest snapshot as it would send it: rkube's snapshot file, etcd's database.
    snap=$(find "$d/n$l" "$d/e$l" \( -name snapshot.bin -o -path '*/snap/db' \) -printf '%s\n' 2>/dev/null | head -1)
    echo 5 >"/proc/$(pid "$l")/clear_refs"
    if [ -n "${PERF_S:-}" ]; then
      perf record -a -g -F 999 -o "$WORK/perf-r$r-$name.data" -- sleep "$PERF_S" >/dev/null 2>&1 &
      perf_pid=$!
    fi
    start_s=$(date +%s.%N)
    sh -c "${START//%/$f}" >>"$d/up.log" 2>&1
    ok=0 deadline=$((SECONDS + 300)) known=-
    while [ "$SECONDS" -lt "$deadline" ]; do
      if [ "$known" = - ]; then
        ls=($(status_field "$E" leader))
        [ "${#ls[@]}" = 3 ] && [ "${ls[$((f - 1))]}" != 0 ] &&
          known=$(since "$start_s")
      fi
      a=($(status_field "$E" applied))
      if [ "${#a[@]}" = 3 ] && [ "${a[$((f - 1))]}" -ge "$((a[l - 1] - 5))" ]; then ok=1; break; fi
      sleep 0.1
    done
    took=$(since "$start_s")
    echo "round=$r variant=$name caught_up=$ok installs=$(installs "$name" "$base" "$f")" \
      "snapshot_bytes=$snap status_leader_s=$known catch_up_s=$took" \
      "follower_hwm_kib=$(hwm "$(pid "$f")") leader_hwm_kib=$(hwm "$(pid "$l")")"
    [ -z "${PERF_S:-}" ] || wait "$perf_pid"
    stop "$name" "$bin" "$d"
    [ -n "${KEEP:-}" ] || rm -rf "$d"
  done
done
