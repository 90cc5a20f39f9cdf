#!/usr/bin/env bash
# rkube against etcd: a three-member rkube cluster and a three-member etcd cluster on loopback,
# one after the other, with the same client (`rkube bench`, which speaks only the etcd v3 API),
# the same TLS setup (mutual TLS on client and peer ports, every certificate from the CA that
# `rkube up` makes), data on the same filesystem (WORKDIR) and fsync on (neither system turns it
# off). Workloads, for each system:
#
#   put       1, 16 and 256 concurrent clients, 8-byte keys, 256-byte values, to the leader
#   range     linearizable and serializable gets of one key, 1 and 256 clients, all members,
#             over 10,000 preloaded keys
#   watch     1,000 watchers (100 streams over 10 connections to all members) on one key,
#             1,000 puts/s for 10 s; latency = receive time - send time stamped in the value
#   failover  SIGKILL of the leader, time until a write through another member succeeds; 3 rounds
#
# rkube runs with --store-only: the comparison is of the stores, without the Kubernetes API.
# Peak RSS per member is VmHWM from /proc/PID/status, reset (clear_refs) before each workload.
# It prints the machine and load, then one markdown table per workload, ratios first
# (rkube ÷ etcd). Raw results stay in WORKDIR/results.jsonl, logs in WORKDIR/{rkube,etcd}.
#
#   cargo build --release -p rkube && cluster-tests/bench/vs-etcd.sh [WORKDIR]
#
# Needs etcd 3.4 (Debian's etcd-server) and python3. Environment: RKUBE (binary, default
# target/release/rkube), ETCD (default etcd), RK_PORT and ET_PORT (first ports of the two
# clusters, default 52379 and 53379; each member uses three ports 10 apart), and the sizes
# PUT1_TOTAL, PUT_TOTAL, RANGE1_TOTAL, RANGE_TOTAL, RANGE_KEYS, WATCH_SECONDS, FAILOVER_ROUNDS.
set -euo pipefail
cd "$(dirname "$0")/../.."
RKUBE=${RKUBE:-target/release/rkube}
ETCD=${ETCD:-etcd}
RK_PORT=${RK_PORT:-52379}
ET_PORT=${ET_PORT:-53379}
PUT1_TOTAL=${PUT1_TOTAL:-2000}
PUT_TOTAL=${PUT_TOTAL:-20000}
RANGE1_TOTAL=${RANGE1_TOTAL:-5000}
RANGE_TOTAL=${RANGE_TOTAL:-50000}
RANGE_KEYS=${RANGE_KEYS:-10000}
WATCH_SECONDS=${WATCH_SECONDS:-10}
FAILOVER_ROUNDS=${FAILOVER_ROUNDS:-3}

for tool in "$RKUBE" "$ETCD" python3; do
  command -v "$tool" >/dev/null || { echo "vs-etcd.sh: $tool not found" >&2; exit 2; }
done
WORK=${1:-$(mktemp -d)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
RK=$WORK/rkube
ET=$WORK/etcd
RESULTS=$WORK/results.jsonl
if [ -e "$RK" ] || [ -e "$ET" ]; then
  echo "vs-etcd.sh: $WORK already holds a run; give a new or empty WORKDIR" >&2
  exit 2
fi
mkdir -p "$ET"
: >"$RESULTS"

etcd_pids() { for i in 1 2 3; do [ -f "$ET/e$i.pid" ] && cat "$ET/e$i.pid"; done; return 0; }
stop_etcd() {
  local pids
  pids=$(etcd_pids)
  [ -n "$pids" ] || return 0
  kill $pids 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 $pids 2>/dev/null || break
    sleep 0.1
  done
  kill -9 $pids 2>/dev/null || true
  rm -f "$ET"/e?.pid
}
cleanup() {
  "$RKUBE" down --dir "$RK" >/dev/null 2>&1 || true
  stop_etcd
}
trap cleanup EXIT

echo "== $(date -u '+%F %T') UTC, $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== rkube: $("$RKUBE" --version), etcd: $("$ETCD" --version | head -1)"
echo "== data in $WORK ($(df -T "$WORK" | awk 'NR==2{print $2}'))"

eps() { # eps PORT: the three client URLs
  echo "https://127.0.0.1:$1,https://127.0.0.1:$(($1 + 10)),https://127.0.0.1:$(($1 + 20))"
}

# ports_free BASE: waits (up to 90 s) until no socket, not even one in TIME-WAIT, holds a port of the cluster at
# BASE. Ports here lie in Linux's usual ephemeral range, so an outgoing connection can hold one.
ports_free() {
  local filter="" p n
  for p in $(seq "$1" $(($1 + 22))); do filter="$filter${filter:+ or }sport = :$p"; done
  for n in $(seq 180); do
    [ -z "$(ss -Htan state all "( $filter )")" ] && return 0
    sleep 0.5
  done
  echo "vs-etcd.sh: ports $1-$(($1 + 22)) stay in use:" >&2
  ss -Htan state all "( $filter )" >&2
  echo "pick others with RK_PORT / ET_PORT" >&2
  exit 1
}
# wait_members URLS: waits until all three members answer and one of them leads.
wait_members() {
  local n
  for n in $(seq 150); do
    [ "$("$RKUBE" status --endpoints "$1" "${TLS[@]}" 2>/dev/null | grep -cE ' (leader|follower) ')" = 3 ] && return 0
    sleep 0.2
  done
  echo "vs-etcd.sh: the cluster at $1 did not come up whole within 30 s; see the logs in $WORK" >&2
  exit 1
}

# The rkube cluster first: `rkube up` also makes the CA and the certificates both systems use.
ports_free "$RK_PORT"
"$RKUBE" up --dir "$RK" --base-port "$RK_PORT" --store-only --detach >"$WORK/rkube-up.log"
PKI=$RK/pki
TLS=(--cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")
wait_members "$(eps "$RK_PORT")"

# etcd members: a start script per member, also used by `bench failover --restart`.
ET_CLUSTER=""
for i in 1 2 3; do
  ET_CLUSTER="$ET_CLUSTER${ET_CLUSTER:+,}e$i=https://127.0.0.1:$((ET_PORT + 10 * (i - 1) + 1))"
done
for i in 1 2 3; do
  c=$((ET_PORT + 10 * (i - 1)))
  cat >"$ET/e$i.start" <<EOF
#!/bin/sh
"$ETCD" --name e$i --data-dir "$ET/e$i" \\
  --listen-client-urls https://127.0.0.1:$c --advertise-client-urls https://127.0.0.1:$c \\
  --listen-peer-urls https://127.0.0.1:$((c + 1)) --initial-advertise-peer-urls https://127.0.0.1:$((c + 1)) \\
  --listen-metrics-urls http://127.0.0.1:$((c + 2)) \\
  --initial-cluster $ET_CLUSTER --initial-cluster-token vs-rkube --initial-cluster-state new \\
  --cert-file "$PKI/n$i.crt" --key-file "$PKI/n$i.key" --trusted-ca-file "$PKI/ca.crt" --client-cert-auth \\
  --peer-cert-file "$PKI/n$i.crt" --peer-key-file "$PKI/n$i.key" --peer-trusted-ca-file "$PKI/ca.crt" \\
  --peer-client-cert-auth >>"$ET/e$i.log" 2>&1 </dev/null &
echo \$! >"$ET/e$i.pid"
EOF
done

SYSTEM=""   # rkube or etcd
EPS=""      # its client URLs
PIDFILES="" # its pid files, space-separated
RESTART=""  # the command that restarts a killed member (see bench failover --restart)
PIDMAP=""   # ENDPOINT=PIDFILE,...

use_system() {
  SYSTEM=$1
  if [ "$SYSTEM" = rkube ]; then
    EPS=$(eps "$RK_PORT")
    PIDFILES="$RK/n1.pid $RK/n2.pid $RK/n3.pid"
    RESTART="'$RKUBE' up --dir '$RK' --detach >/dev/null"
  else
    EPS=$(eps "$ET_PORT")
    PIDFILES="$ET/e1.pid $ET/e2.pid $ET/e3.pid"
    RESTART='sh "${RKUBE_BENCH_PIDFILE%.pid}.start"'
  fi
  PIDMAP=$(paste -d= <(tr , '\n' <<<"$EPS") <(tr ' ' '\n' <<<"$PIDFILES") | paste -sd,)
}

member_pids() { for f in $PIDFILES; do echo "$(cat "$f")"; done; }
reset_peaks() { for p in $(member_pids); do echo 5 >"/proc/$p/clear_refs" 2>/dev/null || true; done; }
peaks_kb() { # the members' VmHWM in kB, comma-separated
  for p in $(member_pids); do awk '/^VmHWM:/{print $2}' "/proc/$p/status" 2>/dev/null || echo null; done | paste -sd,
}

# workload NAME RSS(yes|no) BENCH-ARGS...: runs one workload on the current system and appends
# {"system", "name", "rss_kb", "result"} to results.jsonl.
workload() {
  local name=$1 rss=$2 out json
  shift 2
  echo "-- $SYSTEM $name: rkube bench $*"
  reset_peaks
  out=$("$RKUBE" bench --endpoints "$EPS" "${TLS[@]}" "$@") || {
    echo "$out"
    echo "vs-etcd.sh: $SYSTEM $name failed" >&2
    exit 1
  }
  echo "$out" | grep -v '^BENCH_JSON '
  json=$(echo "$out" | sed -n 's/^BENCH_JSON //p' | tail -1)
  [ -n "$json" ] || { echo "vs-etcd.sh: no BENCH_JSON line from $SYSTEM $name" >&2; exit 1; }
  local peaks=null
  [ "$rss" = yes ] && peaks="[$(peaks_kb)]"
  printf '{"system":"%s","name":"%s","rss_kb":%s,"result":%s}\n' "$SYSTEM" "$name" "$peaks" "$json" >>"$RESULTS"
}

suite() {
  use_system "$1"
  workload put-1 yes put --clients 1 --total "$PUT1_TOTAL"
  workload put-16 yes put --clients 16 --total "$PUT_TOTAL"
  workload put-256 yes put --clients 256 --total "$PUT_TOTAL"
  workload range-l-1 yes range --consistency l --clients 1 --total "$RANGE1_TOTAL" --keys "$RANGE_KEYS"
  workload range-l-256 yes range --consistency l --clients 256 --total "$RANGE_TOTAL" --keys "$RANGE_KEYS" --no-preload
  workload range-s-1 yes range --consistency s --clients 1 --total "$RANGE1_TOTAL" --keys "$RANGE_KEYS" --no-preload
  workload range-s-256 yes range --consistency s --clients 256 --total "$RANGE_TOTAL" --keys "$RANGE_KEYS" --no-preload
  workload watch yes watch-latency --watchers 1000 --streams 100 --connections 10 --rate 1000 --duration "$WATCH_SECONDS"
  # Members are killed and restarted, so their peaks are not comparable: no RSS here.
  workload failover no failover --rounds "$FAILOVER_ROUNDS" --pid-files "$PIDMAP" --restart "$RESTART"
}

suite rkube
"$RKUBE" down --dir "$RK" >/dev/null

# start_etcd I: starts member eI; when another socket took one of its ports in the meantime
# (bind: address already in use), waits for the ports and tries again.
start_etcd() {
  local try
  for try in 1 2 3 4 5; do
    sh "$ET/e$1.start"
    sleep 1
    kill -0 "$(cat "$ET/e$1.pid")" 2>/dev/null && return 0
    grep -q 'address already in use' "$ET/e$1.log" || break
    ports_free "$ET_PORT"
  done
  echo "vs-etcd.sh: etcd member e$1 does not start; see $ET/e$1.log" >&2
  exit 1
}
ports_free "$ET_PORT"
for i in 1 2 3; do start_etcd "$i"; done
wait_members "$(eps "$ET_PORT")"
suite etcd
stop_etcd

echo
echo "== finished $(date -u '+%F %T') UTC, load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$RESULTS" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1])]
res = {(r["system"], r["name"]): r for r in rows}

def num(x, digits=2):
    if x is None:
        return "—"
    if isinstance(x, float) and x >= 100 or isinstance(x, int):
        return f"{round(x):,}"
    return f"{x:.{digits}f}"

def ratio(a, b):
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}"

def rss(r):
    kb = r["rss_kb"]
    if not kb or any(k is None for k in kb):
        return None, "—"
    mib = [k / 1024 for k in kb]
    return max(mib), " / ".join(f"{m:.0f}" for m in mib)

def table(title, name, metrics):
    rk, et = res.get(("rkube", name)), res.get(("etcd", name))
    if not rk or not et:
        return
    print(f"### {title}\n")
    print("| metric | rkube ÷ etcd | rkube | etcd |")
    print("|---|---|---|---|")
    for label, get in metrics:
        a, b = get(rk), get(et)
        print(f"| {label} | {ratio(a, b)} | {num(a)} | {num(b)} |")
    (a, sa), (b, sb) = rss(rk), rss(et)
    if a is not None and b is not None:
        print(f"| peak RSS per member, MiB (ratio of the largest) | {ratio(a, b)} | {sa} | {sb} |")
    print()

r = lambda k: (lambda x: x["result"].get(k))
load = [("throughput, ops/s", r("throughput")), ("p50 latency, ms", r("p50_ms")),
        ("p99 latency, ms", r("p99_ms")), ("errors", r("errors"))]
for name, title in [("put-1", "put, 1 client, to the leader"),
                    ("put-16", "put, 16 clients, to the leader"),
                    ("put-256", "put, 256 clients, to the leader"),
                    ("range-l-1", "linearizable range (get of one key), 1 client"),
                    ("range-l-256", "linearizable range (get of one key), 256 clients over all members"),
                    ("range-s-1", "serializable range (get of one key), 1 client"),
                    ("range-s-256", "serializable range (get of one key), 256 clients over all members")]:
    table(title, name, load)
table("watch event latency, 1,000 watchers, 1,000 puts/s", "watch",
      [("achieved put rate, puts/s", r("put_rate")), ("p50 event latency, ms", r("p50_ms")),
       ("p99 event latency, ms", r("p99_ms")), ("events received", r("events")),
       ("events expected", r("events_expected"))])
table("failover: SIGKILL of the leader to the first successful write", "failover",
      [("p50 of rounds, ms", r("p50_ms")), ("max of rounds, ms", r("max_ms"))])
for s in ("rkube", "etcd"):
    f = res.get((s, "failover"))
    if f:
        print(f"- {s} failover rounds: " + ", ".join(f"{v:.0f} ms" for v in f["result"]["rounds_ms"]))
EOF
