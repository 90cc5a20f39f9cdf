#!/usr/bin/env bash
# Memory of a Raft snapshot's trip: a follower is stopped, the leader takes TOTAL puts (values of
# VAL bytes, all distinct keys) and snapshots after every 1,000 entries, purging the log behind
# it, then the follower starts again and catches up from a snapshot. One line per variant and
# round, the variants alternating: the leader's snapshot size, whether the follower caught up and
# how long that took from its start, the follower's peak RSS (VmHWM since its start) and the
# leader's (reset just before the follower starts, so it covers the send). ROUNDS rounds (3).
#
# A variant is NAME=BINARY: an rkube binary, or etcd's when NAME is etcd (then RKUBE names the
# rkube binary whose `up` makes the certificates and whose `bench put` loads both systems).
#
#   cluster-tests/bench/snapshot-install.sh NAME=BINARY [NAME=BINARY ...] > results.txt
#   WORK=DIR ROUNDS=3 TOTAL=200000 VAL=1024 PORT=25379 (all optional)
set -u
WORK=${WORK:-$(mktemp -d)} ROUNDS=${ROUNDS:-3} PORT=${PORT:-25379}
TOTAL=${TOTAL:-200000} VAL=${VAL:-1024}
VARIANTS=("$@")
RKUBE=${RKUBE:-${VARIANTS[0]#*=}}

eps() { echo "https://127.0.0.1:$1,https://127.0.0.1:$(($1 + 10)),https://127.0.0.1:$(($1 + 20))"; }

ctl() { env -u ETCDCTL_ENDPOINTS ETCDCTL_API=3 etcdctl "${TLS[@]}" "$@"; }

# status_field EPS FIELD: FIELD of each endpoint's status, one per line, in order.
status_field() {
  ctl --endpoints "$1" endpoint status -w json 2>/dev/null | python3 -c 'import json, sys
for r in json.load(sys.stdin):
    s = r["Status"]
    print({"member": s["header"].get("member_id", 0), "leader": s.get("leader", 0),
           "applied": s.get("raftAppliedIndex", 0)}[sys.argv[1]])' "$2"
}

# leader EPS: which member (1-3) leads.
leader() {
  local lead i=0 m
  lead=$(status_field "$1" leader | head -1)
  for m in $(status_field "$1" member); do
    i=$((i + 1)); [ "$m" = "$lead" ] && echo "$i"
  done
}

hwm() { awk '/VmHWM/{print $2}' "/proc/$1/status"; }

# The certificates every cluster uses, made by an rkube cluster started once.
PKI=$WORK/pki
if [ ! -d "$PKI" ]; then
  timeout 120 "$RKUBE" up --dir "$WORK/pki-cluster" --base-port "$PORT" --store-only --detach >/dev/null 2>&1 ||
    { echo "snapshot-install.sh: rkube up failed in $WORK/pki-cluster" >&2; exit 1; }
  timeout 60 "$RKUBE" down --dir "$WORK/pki-cluster" >/dev/null 2>&1
  cp -r "$WORK/pki-cluster/pki" "$PKI"
  rm -rf "$WORK/pki-cluster"
fi
TLS=(--cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")

# start NAME BIN DIR BASE: a fresh cluster; sets PIDF (pid file pattern, % for the member)
# and START (the command that starts member % again).
start() {
  local name=$1 bin=$2 d=$3 base=$4 i c cluster=""
  if [ "$name" != etcd ]; then
    cp -r "$PKI" "$d/pki"
    timeout 120 "$bin" up --dir "$d" --base-port "$base" --store-only --detach \
      --snapshot-count 1000 --snapshot-catchup-entries 100 >"$d/up.log" 2>&1 || return 1
    PIDF="$d/n%.pid" START="'$bin' up --dir '$d' --detach"
    return 0
  fi
  for i in 1 2 3; do cluster="$cluster${cluster:+,}e$i=https://127.0.0.1:$((base + 10 * (i - 1) + 1))"; done
  for i in 1 2 3; do
    c=$((base + 10 * (i - 1)))
    cat >"$d/e$i.start" <<EOF
"$bin" --name e$i --data-dir "$d/e$i" --snapshot-count 1000 \\
  --listen-client-urls https://127.0.0.1:$c --advertise-client-urls https://127.0.0.1:$c \\
  --listen-peer-urls https://127.0.0.1:$((c + 1)) --initial-advertise-peer-urls https://127.0.0.1:$((c + 1)) \\
  --listen-metrics-urls http://127.0.0.1:$((c + 2)) \\
  --initial-cluster $cluster --initial-cluster-token snap-$base --initial-cluster-state new \\
  --cert-file "$PKI/n$i.crt" --key-file "$PKI/n$i.key" --trusted-ca-file "$PKI/ca.crt" --client-cert-auth \\
  --peer-cert-file "$PKI/n$i.crt" --peer-key-file "$PKI/n$i.key" --peer-trusted-ca-file "$PKI/ca.crt" \\
  --peer-client-cert-auth >>"$d/e$i.log" 2>&1 </dev/null &
echo \$! >"$d/e$i.pid"
EOF
    sh "$d/e$i.start"
  done
  PIDF="$d/e%.pid" START="sh '$d/e%.start'"
  for _ in $(seq 150); do
    [ "$(status_field "$(eps "$base")" member | wc -l)" = 3 ] && [ -n "$(leader "$(eps "$base")")" ] && return 0
    sleep 0.2
  done
  return 1
}

stop() { # stop NAME BIN DIR
  if [ "$1" != etcd ]; then timeout 60 "$2" down --dir "$3" >/dev/null 2>&1; return; fi
  kill "$(cat "$3"/e1.pid)" "$(cat "$3"/e2.pid)" "$(cat "$3"/e3.pid)" 2>/dev/null
  sleep 2
  kill -9 "$(cat "$3"/e1.pid)" "$(cat "$3"/e2.pid)" "$(cat "$3"/e3.pid)" 2>/dev/null
}

# installs NAME BASE N: snapshots member N received since its start (its metrics).
installs() {
  curl -sf "http://127.0.0.1:$(($2 + 10 * ($3 - 1) + 2))/metrics" |
    awk -v m="$([ "$1" = etcd ] && echo etcd_network_snapshot_receive_success || echo rkube_raft_snapshot_installs)" \
      '$1 == m || index($1, m "{") == 1 {s += $2} END {print s + 0}'
}

pid() { cat "${PIDF//%/$1}"; }

for r in $(seq 1 "$ROUNDS"); do
  order=("${VARIANTS[@]}")
  # Alternate: every other round in reverse.
  if [ $((r % 2)) = 0 ]; then
    order=(); for ((i = ${#VARIANTS[@]} - 1; i >= 0; i--)); do order+=("${VARIANTS[$i]}"); done
  fi
  for v in "${order[@]}"; do
    name=${v%%=*} bin=${v#*=} d=$WORK/r$r-$name
    rm -rf "$d"; mkdir -p "$d"
    base=$((PORT + 30 * (r % 10)))
    E=$(eps "$base")
    if ! start "$name" "$bin" "$d" "$base"; then
      echo "round=$r variant=$name error=start-failed"; stop "$name" "$bin" "$d"; continue
    fi
    l=$(leader "$E"); f=$((l % 3 + 1))
    kill -9 "$(pid "$f")"
    "$RKUBE" bench --endpoints "$E" "${TLS[@]}" put --clients 64 --total "$TOTAL" --key-space "$TOTAL" \
      --val-size "$VAL" --key-size 32 >"$d/load.log" 2>&1
    # The leader's newest snapshot as it would send it: rkube's snapshot file, etcd's database.
    snap=$(find "$d/n$l" "$d/e$l" \( -name snapshot.bin -o -path '*/snap/db' \) -printf '%s\n' 2>/dev/null | head -1)
    echo 5 >"/proc/$(pid "$l")/clear_refs"
    start_s=$(date +%s.%N)
    sh -c "${START//%/$f}" >>"$d/up.log" 2>&1
    ok=0 deadline=$((SECONDS + 300))
    while [ "$SECONDS" -lt "$deadline" ]; do
      a=($(status_field "$E" applied))
      if [ "${#a[@]}" = 3 ] && [ "${a[$((f - 1))]}" -ge "$((a[l - 1] - 5))" ]; then ok=1; break; fi
      sleep 0.1
    done
    took=$(awk -v a="$start_s" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    echo "round=$r variant=$name caught_up=$ok installs=$(installs "$name" "$base" "$f")" \
      "snapshot_bytes=$snap catch_up_s=$took" \
      "follower_hwm_kib=$(hwm "$(pid "$f")") leader_hwm_kib=$(hwm "$(pid "$l")")"
    stop "$name" "$bin" "$d"
    [ -n "${KEEP:-}" ] || rm -rf "$d"
  done
done
