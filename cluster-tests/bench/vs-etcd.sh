#!/usr/bin/env bash
# rkube against etcd, side by side: a three-member rkube cluster (`rkube up --store-only`) and a
# three-member etcd 3.4 cluster on loopback, run alternately for ROUNDS rounds (odd rounds rkube
# first, even rounds etcd first), each on fresh data dirs every round, so that noise on the
# machine falls on both. Both get the same clients, the same certificates (mutual TLS on client
# and peer ports, from the CA the first `rkube up` makes), the same --heartbeat-interval and
# --election-timeout, the same threads (`rkube up` gives each member --worker-threads = CPUs / 3,
# at least 1; each etcd member gets GOMAXPROCS of the same number, ETCD_GOMAXPROCS to change it),
# and data on the same filesystem (WORKDIR). Durability is what each does as
# run: the report shows every member's command line, etcd's effective settings from its log, and
# the log fsyncs each system's metrics counted per write.
#
#   cargo build --release -p rkube && cluster-tests/bench/vs-etcd.sh [WORKDIR]
#
# WORKDIR (default: a new temporary directory) must be new or empty; it keeps every round's
# data dirs, logs and workload outputs: about 5.5 GB per round with checkperf (its 200,000 keys
# in six members' stores, logs and snapshots), so a default run leaves about 28 GB there.
# Delete it when the report is read; a full disk stops everything on the machine. A full default run takes about half an hour on two
# cores (5 rounds of about 3 minutes per system, checkperf a third of it); try it first with
# small sizes, e.g. ROUNDS=2 PUT1_TOTAL=100 PUT_TOTAL=500 RANGE1_TOTAL=200 RANGE_TOTAL=1000
# RANGE_KEYS=200 WATCH_SECONDS=2 FAILOVER_ROUNDS=1 WORKLOADS=put-1,watch,failover.
#
# Workloads (WORKLOADS, space- or comma-separated, run in the order given; default all, in
# this order):
#
#   put-1 put-16 put-256    1, 16, 256 clients in a closed loop, 8-byte keys, 256-byte values,
#                           to the leader (`rkube bench put`)
#   range-l-1 range-l-256   linearizable get of one key, 1 / 256 clients over all members,
#   range-s-1 range-s-256   serializable likewise, over RANGE_KEYS preloaded keys
#   watch                   1,000 watchers (100 streams over 10 connections to all members) on
#                           one key, 1,000 puts/s for WATCH_SECONDS; latency = receive time -
#                           send time stamped in the value
#   watch-200               the same at 200 puts/s, a rate both systems sustain (etcd 3.4 tops
#                           out near 270 puts/s with 1,000 watchers here): latency without
#                           queueing behind a saturated server
#   checkperf               `etcdctl check perf --load=CHECKPERF_LOAD` (etcd's own client: 60 s
#                           of puts at a fixed rate; its verdict, writes/s, slowest request,
#                           stddev; a failure is recorded, not fatal)
#   failover                SIGKILL of the leader until a write through another member
#                           succeeds, FAILOVER_ROUNDS kills per round
#
# Peak RSS per member is VmHWM from /proc/PID/status, reset (clear_refs) before each workload.
# Every measurement is appended as a JSON line to WORKDIR/results.jsonl; vs-etcd-report.py
# (beside this script) turns that into markdown tables (median over rounds, min-max, ratio of
# medians) in WORKDIR/report.md and SVG charts (report-throughput.svg, report-latency.svg).
# With RESULTS_OUT=DIR (e.g. cluster-tests/bench/results) the raw results, the tables and the
# charts are also kept as DIR/vs-etcd-<UTC date>.{jsonl,md} and -{throughput,latency}.svg.
#
# Needs etcd and etcdctl 3.4 (Debian's etcd-server and etcd-client; etcdctl only for checkperf),
# python3 (standard library only), curl, ss and timeout. Environment:
#   ROUNDS (5), WORKLOADS (all), HEARTBEAT_MS (100), ELECTION_MS (1000), CHECKPERF_LOAD (l),
#   sizes PUT1_TOTAL (2000), PUT_TOTAL (20000), RANGE1_TOTAL (5000), RANGE_TOTAL (50000),
#   RANGE_KEYS (10000), WATCH_SECONDS (10), FAILOVER_ROUNDS (3),
#   WORKLOAD_TIMEOUT (600: seconds after which one workload is stopped and recorded as failed),
#   RESULTS_OUT (unset: keep results only in WORKDIR), RKUBE (target/release/rkube, from the
#   top of the repository), ETCD (etcd), ETCDCTL (etcdctl), RK_PORT and ET_PORT (52379 and
#   53379: first ports; member i uses three ports from PORT+10*(i-1), and round r moves them
#   up by 30*((r-1) mod 10), so that a round does not wait for the last one's closed sockets).
set -euo pipefail
CALLER=$(pwd) # WORKDIR and RESULTS_OUT are relative to where the script is called from
cd "$(dirname "$0")/../.."
REPO=$(pwd)
REPORT=cluster-tests/bench/vs-etcd-report.py
RKUBE=${RKUBE:-target/release/rkube}
ETCD=${ETCD:-etcd}
ETCDCTL=${ETCDCTL:-etcdctl}
RK_PORT=${RK_PORT:-52379}
ET_PORT=${ET_PORT:-53379}
ROUNDS=${ROUNDS:-5}
HEARTBEAT_MS=${HEARTBEAT_MS:-100}
ELECTION_MS=${ELECTION_MS:-1000}
CHECKPERF_LOAD=${CHECKPERF_LOAD:-l}
# The threads `rkube up` gives each of its three members (up/members.rs, worker_share).
ETCD_GOMAXPROCS=${ETCD_GOMAXPROCS:-$(n=$(($(nproc) / 3)); echo $((n > 0 ? n : 1)))}
PUT1_TOTAL=${PUT1_TOTAL:-2000}
PUT_TOTAL=${PUT_TOTAL:-20000}
RANGE1_TOTAL=${RANGE1_TOTAL:-5000}
RANGE_TOTAL=${RANGE_TOTAL:-50000}
RANGE_KEYS=${RANGE_KEYS:-10000}
WATCH_SECONDS=${WATCH_SECONDS:-10}
FAILOVER_ROUNDS=${FAILOVER_ROUNDS:-3}
WORKLOAD_TIMEOUT=${WORKLOAD_TIMEOUT:-600}
RESULTS_OUT=${RESULTS_OUT:-}
ALL="put-1 put-16 put-256 range-l-1 range-l-256 range-s-1 range-s-256 watch watch-200 checkperf failover"
WORKLOADS=${WORKLOADS:-all}
[ "$WORKLOADS" = all ] && WORKLOADS=$ALL
WORKLOADS=$(tr ',' ' ' <<<"$WORKLOADS" | xargs)

die() { echo "vs-etcd.sh: $*" >&2; exit 2; }
for w in $WORKLOADS; do
  [[ " $ALL " == *" $w "* ]] || die "unknown workload $w (known: $ALL)"
done
for n in ROUNDS HEARTBEAT_MS ELECTION_MS WORKLOAD_TIMEOUT RK_PORT ET_PORT; do
  [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "$n must be a positive integer, not '${!n}'"
done
[ $((RK_PORT > ET_PORT ? RK_PORT - ET_PORT : ET_PORT - RK_PORT)) -ge 300 ] ||
  die "RK_PORT and ET_PORT must be at least 300 apart (each round moves the ports up by up to 270)"
tools=("$RKUBE" "$ETCD" python3 curl ss timeout)
[[ " $WORKLOADS " == *" checkperf "* ]] && tools+=("$ETCDCTL")
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
# Everything goes to 127.0.0.1; no proxy may take part.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY grpc_proxy GRPC_PROXY

WORK=${1:-$(mktemp -d)}
[[ $WORK == /* ]] || WORK=$CALLER/$WORK
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
RESULTS=$WORK/results.jsonl
[ -z "$(ls -A "$WORK")" ] || die "$WORK is not empty; give a new or empty WORKDIR"
: >"$RESULTS"

CHILD=""   # the workload running in the background (see bounded)
cleanup() {
  local rc=$? d
  trap - EXIT INT TERM
  if [ -n "$CHILD" ]; then
    kill "$CHILD" 2>/dev/null || true
    wait "$CHILD" 2>/dev/null || true
  fi
  for d in "$WORK"/round-*/rkube; do
    [ -f "$d/cluster.json" ] && { timeout 60 "$RKUBE" down --dir "$d" >/dev/null 2>&1 || true; }
  done
  for d in "$WORK"/round-*/etcd; do
    [ -d "$d" ] && stop_etcd "$d"
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# bounded SECONDS OUT ERR CMD...: runs CMD (stdout to OUT, stderr to ERR), stopped after
# SECONDS. It runs in the background so that a signal to this script stops it at once.
bounded() {
  local secs=$1 out=$2 err=$3 rc=0
  shift 3
  timeout -k 10 "$secs" "$@" >"$out" 2>"$err" </dev/null &
  CHILD=$!
  wait "$CHILD" || rc=$?
  CHILD=""
  return "$rc"
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
now() { date -u '+%FT%TZ'; }

# The run's header, also the first line of results.jsonl.
FS=$(findmnt -no FSTYPE -T "$WORK" 2>/dev/null || df -T "$WORK" | awk 'NR==2{print $2}')
FS_OPTS=$(findmnt -no OPTIONS -T "$WORK" 2>/dev/null || echo unknown)
CPU=$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)
MEM_GIB=$(awk '/^MemTotal:/{printf "%.1f", $2 / 1048576}' /proc/meminfo)
RK_VERSION=$("$RKUBE" --version)
GIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain -uno 2>/dev/null)" ] && GIT="$GIT with uncommitted changes"
ET_VERSION=$("$ETCD" --version | awk '/etcd Version/{v=$3} /Go Version/{g=$3} END{print v " (" g ")"}')
CTL_VERSION=none
[[ " $WORKLOADS " == *" checkperf "* ]] && CTL_VERSION=$("$ETCDCTL" version | awk '/etcdctl version/{print $3}')
echo "== $(date -u '+%F %T') UTC; $(nproc) cores ($CPU), $MEM_GIB GiB, kernel $(uname -r)"
echo "== data in $WORK: $FS ($FS_OPTS); load $(loadavg)"
echo "== rkube: $RK_VERSION (tree $GIT), etcd: $ET_VERSION, etcdctl: $CTL_VERSION"
echo "== both: --heartbeat-interval $HEARTBEAT_MS --election-timeout $ELECTION_MS; $ROUNDS rounds of: $WORKLOADS"
python3 "$REPORT" header --date "$(now)" --cores "$(nproc)" --cpu "$CPU" --mem-gib "$MEM_GIB" \
  --kernel "$(uname -r)" --fs "$FS" --fs-options "$FS_OPTS" --load "$(loadavg)" \
  --rkube "$RK_VERSION" --tree "$GIT" --etcd "$ET_VERSION" --etcdctl "$CTL_VERSION" \
  --heartbeat-ms "$HEARTBEAT_MS" --election-ms "$ELECTION_MS" --rounds "$ROUNDS" \
  --workloads "$WORKLOADS" --checkperf-load "$CHECKPERF_LOAD" \
  --sizes "PUT1_TOTAL=$PUT1_TOTAL PUT_TOTAL=$PUT_TOTAL RANGE1_TOTAL=$RANGE1_TOTAL RANGE_TOTAL=$RANGE_TOTAL RANGE_KEYS=$RANGE_KEYS WATCH_SECONDS=$WATCH_SECONDS FAILOVER_ROUNDS=$FAILOVER_ROUNDS" \
  >>"$RESULTS"

eps() { # eps PORT: the three client URLs
  echo "https://127.0.0.1:$1,https://127.0.0.1:$(($1 + 10)),https://127.0.0.1:$(($1 + 20))"
}

# ports_free BASE: waits (up to 90 s) until no socket, not even one in TIME-WAIT, holds a port of
# the cluster at BASE. Ports here lie in Linux's usual ephemeral range, so an outgoing connection
# can hold one.
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

# wait_members URLS: waits (up to 30 s) until all three members answer and one of them leads.
wait_members() {
  local n
  for n in $(seq 150); do
    [ "$(timeout 10 "$RKUBE" status --endpoints "$1" "${TLS[@]}" 2>/dev/null | grep -cE ' (leader|follower) ')" = 3 ] && return 0
    sleep 0.2
  done
  echo "vs-etcd.sh: the cluster at $1 did not come up whole within 30 s; see the logs in $WORK" >&2
  exit 1
}

# stop_etcd DIR: stops the members whose pid files are in DIR (TERM, then KILL after 10 s).
stop_etcd() {
  local pids n
  pids=$(cat "$1"/e?.pid 2>/dev/null || true)
  [ -n "$pids" ] || return 0
  kill $pids 2>/dev/null || true
  for n in $(seq 100); do
    kill -0 $pids 2>/dev/null || break
    sleep 0.1
  done
  kill -9 $pids 2>/dev/null || true
  rm -f "$1"/e?.pid
}

# start_etcd I: starts member eI of the current round; when another socket took one of its
# ports in the meantime (bind: address already in use), waits for the ports and tries again.
start_etcd() {
  local try
  for try in 1 2 3 4 5; do
    sh "$ET/e$1.start"
    sleep 1
    kill -0 "$(cat "$ET/e$1.pid")" 2>/dev/null && return 0
    grep -q 'address already in use' "$ET/e$1.log" || break
    ports_free "$PORT"
  done
  echo "vs-etcd.sh: etcd member e$1 does not start; see $ET/e$1.log" >&2
  exit 1
}

ROUND=0     # the current round, from 1
ROUND_DIR="" # its directory, WORK/round-N
SYSTEM=""   # rkube or etcd
PORT=""     # the first port of its cluster in this round
EPS=""      # its client URLs
PIDFILES="" # its pid files, space-separated
RESTART=""  # the command that restarts a killed member (see bench failover --restart)
PIDMAP=""   # ENDPOINT=PIDFILE,...
RK=""       # this round's rkube dir
ET=""       # this round's etcd dir
PKI=$WORK/pki # made by the first `rkube up`, then used by every cluster of every round
TLS=(--cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")

# start_system NAME: a new cluster of NAME on fresh data dirs for this round.
start_system() {
  SYSTEM=$1
  if [ "$SYSTEM" = rkube ]; then
    PORT=$((RK_PORT + 30 * ((ROUND - 1) % 10)))
    RK=$ROUND_DIR/rkube
    mkdir -p "$RK"
    [ -d "$PKI" ] && cp -r "$PKI" "$RK/pki"
    ports_free "$PORT"
    timeout 120 "$RKUBE" up --dir "$RK" --base-port "$PORT" --store-only \
      --heartbeat-interval "$HEARTBEAT_MS" --election-timeout "$ELECTION_MS" --detach >"$RK/up.log" 2>&1 ||
      { cat "$RK/up.log" >&2; echo "vs-etcd.sh: rkube up failed; see $RK" >&2; exit 1; }
    [ -d "$PKI" ] || cp -r "$RK/pki" "$PKI"
    PIDFILES="$RK/n1.pid $RK/n2.pid $RK/n3.pid"
    RESTART="'$RKUBE' up --dir '$RK' --detach >/dev/null" # run in this directory
  else
    PORT=$((ET_PORT + 30 * ((ROUND - 1) % 10)))
    ET=$ROUND_DIR/etcd
    mkdir -p "$ET"
    local i c cluster=""
    for i in 1 2 3; do
      cluster="$cluster${cluster:+,}e$i=https://127.0.0.1:$((PORT + 10 * (i - 1) + 1))"
    done
    for i in 1 2 3; do
      c=$((PORT + 10 * (i - 1)))
      # A start script per member, also used by `bench failover --restart`.
      cat >"$ET/e$i.start" <<EOF
#!/bin/sh
GOMAXPROCS=$ETCD_GOMAXPROCS "$ETCD" --name e$i --data-dir "$ET/e$i" \\
  --listen-client-urls https://127.0.0.1:$c --advertise-client-urls https://127.0.0.1:$c \\
  --listen-peer-urls https://127.0.0.1:$((c + 1)) --initial-advertise-peer-urls https://127.0.0.1:$((c + 1)) \\
  --listen-metrics-urls http://127.0.0.1:$((c + 2)) \\
  --initial-cluster $cluster --initial-cluster-token vs-rkube-$ROUND --initial-cluster-state new \\
  --heartbeat-interval $HEARTBEAT_MS --election-timeout $ELECTION_MS \\
  --cert-file "$PKI/n$i.crt" --key-file "$PKI/n$i.key" --trusted-ca-file "$PKI/ca.crt" --client-cert-auth \\
  --peer-cert-file "$PKI/n$i.crt" --peer-key-file "$PKI/n$i.key" --peer-trusted-ca-file "$PKI/ca.crt" \\
  --peer-client-cert-auth >>"$ET/e$i.log" 2>&1 </dev/null &
echo \$! >"$ET/e$i.pid"
EOF
    done
    ports_free "$PORT"
    for i in 1 2 3; do start_etcd "$i"; done
    PIDFILES="$ET/e1.pid $ET/e2.pid $ET/e3.pid"
    RESTART='sh "${RKUBE_BENCH_PIDFILE%.pid}.start"'
  fi
  EPS=$(eps "$PORT")
  PIDMAP=$(paste -d= <(tr , '\n' <<<"$EPS") <(tr ' ' '\n' <<<"$PIDFILES") | paste -sd,)
  wait_members "$EPS"
  # What each member runs with, as run (paths of this machine replaced), once per system.
  if [ "$ROUND" = 1 ]; then
    local log=""
    [ "$SYSTEM" = etcd ] && log=$ET/e1.log
    python3 "$REPORT" members --system "$SYSTEM" --round "$ROUND" --hide "$WORK=WORKDIR" \
      --hide "$REPO/=" --etcd-log "$log" $(member_pids) >>"$RESULTS"
  fi
}

stop_system() {
  if [ "$SYSTEM" = rkube ]; then
    timeout 60 "$RKUBE" down --dir "$RK" >/dev/null
  else
    stop_etcd "$ET"
  fi
}

member_pids() { # (pid files hold no newline)
  local f
  for f in $PIDFILES; do echo "$(cat "$f" 2>/dev/null || echo 0)"; done
}
reset_peaks() { for p in $(member_pids); do echo 5 2>/dev/null >"/proc/$p/clear_refs" || true; done; }
peaks_kb() { # the members' VmHWM in kB, comma-separated
  for p in $(member_pids); do awk '/^VmHWM:/{print $2}' "/proc/$p/status" 2>/dev/null || echo null; done | paste -sd,
}
# fsyncs: the log fsyncs all members counted so far (rkube: its log's fsync; etcd: its WAL's
# fsync and its backend's commits), as "LOG BACKEND" (backend "-" for rkube).
fsyncs() {
  local i m log=0 backend=0 text
  for i in 0 1 2; do
    m=$((PORT + 10 * i + 2))
    text=$(curl -s --noproxy '*' --max-time 10 "http://127.0.0.1:$m/metrics") || { echo "- -"; return; }
    if [ "$SYSTEM" = rkube ]; then
      log=$((log + $(awk '$1=="rkube_disk_fsync_duration_seconds_count"{n=$2} END{print n+0}' <<<"$text")))
      backend=-
    else
      log=$((log + $(awk '$1=="etcd_disk_wal_fsync_duration_seconds_count"{n=$2} END{print n+0}' <<<"$text")))
      backend=$((backend + $(awk '$1=="etcd_disk_backend_commit_duration_seconds_count"{n=$2} END{print n+0}' <<<"$text")))
    fi
  done
  echo "$log $backend"
}

# workload NAME KIND ARGS...: runs one workload on the current system (KIND bench: `rkube bench
# ARGS`; checkperf: `etcdctl check perf`) and appends its result to results.jsonl. A failure is
# recorded as such; the run goes on.
workload() {
  local name=$1 kind=$2 out err rc=0 fs0 fs1 peaks t0 t1
  shift 2
  out=$ROUND_DIR/$SYSTEM-$name.out
  err=$ROUND_DIR/$SYSTEM-$name.err
  reset_peaks
  fs0=$(fsyncs)
  t0=$(date +%s.%N)
  if [ "$kind" = bench ]; then
    echo "-- round $ROUND, $SYSTEM $name: rkube bench $*"
    bounded "$WORKLOAD_TIMEOUT" "$out" "$err" "$RKUBE" bench --endpoints "$EPS" "${TLS[@]}" "$@" || rc=$?
  else
    echo "-- round $ROUND, $SYSTEM $name: etcdctl check perf --load=$CHECKPERF_LOAD"
    bounded "$WORKLOAD_TIMEOUT" "$out" "$err" env ETCDCTL_API=3 "$ETCDCTL" --endpoints "$EPS" \
      "${TLS[@]}" check perf --load="$CHECKPERF_LOAD" || rc=$?
  fi
  t1=$(date +%s.%N)
  peaks=$(peaks_kb)
  fs1=$(fsyncs)
  # Without BENCH_JSON and etcdctl's progress bar.
  tr '\r' '\n' <"$out" | grep -vE '^BENCH_JSON |^ *[0-9]+ / [0-9]+ |^ *$' | tail -n 8 || true
  [ "$rc" = 0 ] || { echo "   exit code $rc:"; tr '\r' '\n' <"$err" | grep -vE '^ *[0-9]+ / [0-9]+ |^ *$' | tail -n 3; } || true
  python3 "$REPORT" record --kind "$kind" --round "$ROUND" --system "$SYSTEM" --name "$name" \
    --exit-code "$rc" --elapsed "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b - a}')" \
    --rss-kb "$peaks" --fsyncs-before "$fs0" --fsyncs-after "$fs1" --out "$out" --err "$err" \
    --checkperf-load "$CHECKPERF_LOAD" --hide "$WORK=WORKDIR" --hide "$REPO/=" >>"$RESULTS"
}

suite() {
  local w preload=(--keys "$RANGE_KEYS")
  for w in $WORKLOADS; do
    case $w in
      put-1) workload "$w" bench put --clients 1 --total "$PUT1_TOTAL" ;;
      put-16 | put-256) workload "$w" bench put --clients "${w#put-}" --total "$PUT_TOTAL" ;;
      range-?-1 | range-?-256)
        local c=${w#range-}
        local total=$RANGE_TOTAL
        [ "${c#*-}" = 1 ] && total=$RANGE1_TOTAL
        # The first range workload loads the keys; the others read them.
        workload "$w" bench range --consistency "${c%-*}" --clients "${c#*-}" --total "$total" "${preload[@]}"
        preload=(--keys "$RANGE_KEYS" --no-preload)
        ;;
      watch | watch-200)
        local rate=1000
        [ "$w" = watch-200 ] && rate=200
        workload "$w" bench watch-latency --watchers 1000 --streams 100 --connections 10 --rate "$rate" \
          --duration "$WATCH_SECONDS"
        ;;
      checkperf) workload "$w" checkperf ;;
      failover)
        # Members are killed and restarted, so their peaks are not comparable (not reported).
        workload "$w" bench failover --rounds "$FAILOVER_ROUNDS" --pid-files "$PIDMAP" --restart "$RESTART"
        ;;
    esac
  done
}

for ROUND in $(seq "$ROUNDS"); do
  ROUND_DIR=$WORK/round-$ROUND
  mkdir -p "$ROUND_DIR"
  order="rkube etcd"
  [ $((ROUND % 2)) = 0 ] && order="etcd rkube"
  for s in $order; do
    start=$(now)
    load0=$(loadavg)
    echo
    echo "== round $ROUND of $ROUNDS: $s, $(date -u '+%T') UTC, load $load0"
    start_system "$s"
    suite
    stop_system
    load1=$(loadavg)
    echo "== round $ROUND: $s done, $(date -u '+%T') UTC, load $load1"
    printf '{"type":"half","round":%d,"system":"%s","first":%s,"start":"%s","end":"%s","load_start":"%s","load_end":"%s"}\n' \
      "$ROUND" "$s" "$([ "$s" = "${order%% *}" ] && echo true || echo false)" "$start" "$(now)" \
      "$load0" "$load1" >>"$RESULTS"
  done
done

echo
echo "== finished $(date -u '+%F %T') UTC, load $(loadavg)"
echo
python3 "$REPORT" report "$RESULTS" --out "$WORK/report"
cat "$WORK/report.md"
if [ -n "$RESULTS_OUT" ]; then
  [[ $RESULTS_OUT == /* ]] || RESULTS_OUT=$CALLER/$RESULTS_OUT
  mkdir -p "$RESULTS_OUT"
  name=vs-etcd-$(date -u +%F)
  [ -e "$RESULTS_OUT/$name.jsonl" ] && name=vs-etcd-$(date -u +%F-%H%M)
  cp "$RESULTS" "$RESULTS_OUT/$name.jsonl"
  python3 "$REPORT" report "$RESULTS" --out "$RESULTS_OUT/$name" >/dev/null
  echo
  echo "== kept in $RESULTS_OUT: $name.jsonl, $name.md, $name-throughput.svg, $name-latency.svg"
fi
echo "== raw results, logs and charts in $WORK"
