#!/usr/bin/env bash
# Memory of a Raft snapshot's trip: a follower is stopped, the leader takes TOTAL puts (values of
# VAL bytes, all distinct keys) and snapshots, purging the log behind it, then the follower
# starts again and catches up by installing the snapshot. Prints the snapshot's size, how long
# the install took, the follower's peak RSS (VmHWM since its start) and the leader's (reset just
# before the follower starts, so it covers the send), one line per binary and round, alternating
# the binaries. ROUNDS rounds (3).
#
#   cluster-tests/bench/snapshot-install.sh NAME_A=BINARY_A [NAME_B=BINARY_B] [WORKDIR]
set -u
A=$1 B=${2:-} WORK=${3:-$(mktemp -d)} ROUNDS=${ROUNDS:-3} PORT=${PORT:-57379}
TOTAL=${TOTAL:-200000} VAL=${VAL:-1024}

# metric BASE N NAME: member N's Prometheus sample NAME, or nothing.
metric() {
  curl -sf "http://127.0.0.1:$(($1 + 10 * ($2 - 1) + 2))/metrics" | awk -v m="$3" '$1 == m {print $2}'
}

# leader BASE: which member (1-3) leads, from the first member's answer.
leader() {
  env -u ETCDCTL_ENDPOINTS ETCDCTL_API=3 etcdctl --endpoints "$ETCDCTL_ENDPOINTS" endpoint status -w json |
    python3 -c 'import json,sys
rows = json.load(sys.stdin)
lead = rows[0]["Status"]["leader"]
print(next(i + 1 for i, r in enumerate(rows) if r["Status"]["header"]["member_id"] == lead))'
}

hwm() { awk '/VmHWM/{print $2}' "/proc/$1/status"; }

for r in $(seq 1 "$ROUNDS"); do
  order="$A $B"; [ $((r % 2)) = 0 ] && order="$B $A"
  for v in $order; do
    name=${v%%=*} bin=${v#*=} d=$WORK/r$r-$name
    rm -rf "$d"; mkdir -p "$d"
    base=$((PORT + 30 * (r % 10)))
    if ! timeout 120 "$bin" up --dir "$d" --base-port "$base" --store-only --detach \
      --snapshot-count 5000 --snapshot-catchup-entries 500 >"$d/up.log" 2>&1; then
      echo "round=$r variant=$name error=up-failed"; timeout 60 "$bin" down --dir "$d" >/dev/null 2>&1; continue
    fi
    # shellcheck disable=SC1091
    . "$d/env"
    export ETCDCTL_ENDPOINTS=https://127.0.0.1:$base,https://127.0.0.1:$((base + 10)),https://127.0.0.1:$((base + 20))
    l=$(leader); f=$(( l % 3 + 1 ))
    kill -9 "$(cat "$d/n$f.pid")"
    "$bin" bench --endpoints "$ETCDCTL_ENDPOINTS" --cacert "$ETCDCTL_CACERT" --cert "$ETCDCTL_CERT" \
      --key "$ETCDCTL_KEY" put --clients 64 --total "$TOTAL" --key-space "$TOTAL" --val-size "$VAL" \
      --key-size 32 >"$d/load.log" 2>&1
    # The leader's newest snapshot, taken after the follower stopped.
    snap=$(find "$d/n$l" -name snapshot.bin -printf '%s\n' | head -1)
    echo 5 >"/proc/$(cat "$d/n$l.pid")/clear_refs"
    start=$(date +%s.%N)
    timeout 120 "$bin" up --dir "$d" --detach >>"$d/up.log" 2>&1
    # Caught up: it installed a snapshot and applied what the leader has.
    ok=0
    for _ in $(seq 1 1200); do
      installs=$(metric "$base" "$f" rkube_raft_snapshot_installs)
      applied=$(metric "$base" "$f" rkube_raft_applied_index)
      target=$(metric "$base" "$l" rkube_raft_applied_index)
      if [ "${installs:-0}" != 0 ] && [ -n "$applied" ] && [ "${applied%.*}" -ge "$((${target%.*} - 10))" ]; then ok=1; break; fi
      sleep 0.1
    done
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    echo "round=$r variant=$name caught_up=$ok snapshot_bytes=$snap install_s=$took" \
      "follower_hwm_kib=$(hwm "$(cat "$d/n$f.pid")") leader_hwm_kib=$(hwm "$(cat "$d/n$l.pid")")"
    timeout 60 "$bin" down --dir "$d" >/dev/null 2>&1
    rm -rf "$d"
  done
done
