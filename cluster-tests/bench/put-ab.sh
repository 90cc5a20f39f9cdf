#!/usr/bin/env bash
# Two rkube binaries against each other (for example two allocators): put with 1, 16 and 256
# clients on a fresh three-member `rkube up --store-only` cluster of each, alternating which goes
# first, ROUNDS rounds (5). One line per round, binary and workload: throughput, p99 and the
# largest member's peak RSS (VmHWM, reset before each workload), and the three members' CPU
# (user + system, /proc/PID/stat) per write, which varies much less from round to round than
# throughput does. WORKLOADS picks them ("1 16 256" by default; "checkperf" runs
# `etcdctl check perf --load=l`).
#
#   cluster-tests/bench/put-ab.sh NAME_A=BINARY_A NAME_B=BINARY_B [WORKDIR] > results.txt
set -u
A=$1 B=$2 WORK=${3:-$(mktemp -d)} ROUNDS=${ROUNDS:-5} PORT=${PORT:-56379}
WORKLOADS=${WORKLOADS:-1 16 256}
HZ=$(getconf CLK_TCK)

# cpu_ticks DIR: user + system CPU of the cluster's three members so far, in clock ticks.
cpu_ticks() {
  for n in 1 2 3; do cat "/proc/$(cat "$1/n$n.pid")/stat"; done | awk '{s += $14 + $15} END {print s}'
}

# revision: the store's revision, as the first member reports it.
revision() {
  env -u ETCDCTL_ENDPOINTS ETCDCTL_API=3 etcdctl --endpoints "${ETCDCTL_ENDPOINTS%%,*}" endpoint status -w json | grep -o '"revision":[0-9]*' | cut -d: -f2
}

# cpu_per_write TICKS0 TICKS1 WRITES: the members' CPU per write, in microseconds.
cpu_per_write() {
  awk -v a="$1" -v b="$2" -v w="$3" -v hz="$HZ" 'BEGIN {printf "%.0f", (b - a) * 1e6 / hz / w}'
}
for r in $(seq 1 "$ROUNDS"); do
  order="$A $B"; [ $((r % 2)) = 0 ] && order="$B $A"
  for v in $order; do
    name=${v%%=*} bin=${v#*=} d=$WORK/r$r-${v%%=*}
    rm -rf "$d"; mkdir -p "$d"
    base=$((PORT + 30 * (r % 10)))
    if ! timeout 120 "$bin" up --dir "$d" --base-port "$base" --store-only --detach >"$d/up.log" 2>&1; then
      echo "round=$r variant=$name error=up-failed"; timeout 60 "$bin" down --dir "$d" >/dev/null 2>&1; continue
    fi
    # shellcheck disable=SC1091
    . "$d/env"
    # The members themselves, as vs-etcd.sh uses them (the env file names the endpoint proxy).
    export ETCDCTL_ENDPOINTS=https://127.0.0.1:$base,https://127.0.0.1:$((base + 10)),https://127.0.0.1:$((base + 20))
    for w in $WORKLOADS; do
      for n in 1 2 3; do echo 5 >"/proc/$(cat "$d/n$n.pid")/clear_refs"; done
      t0=$(cpu_ticks "$d") rev0=$(revision)
      if [ "$w" = checkperf ]; then
        out=$(ETCDCTL_API=3 timeout 300 etcdctl check perf --load=l 2>&1)
        # Its writes, without the final DeleteRange (one revision); the CPU includes it.
        deletes=1
        fields="workload=checkperf writes_per_s=$(grep -o '[0-9.]* writes/s' <<<"$out" | cut -d' ' -f1) slowest_s=$(grep -o 'Slowest request took [0-9.]*' <<<"$out" | grep -o '[0-9.]*$') errors=$(grep -ci 'error' <<<"$out")"
      else
        total=20000; [ "$w" = 1 ] && total=2000
        out=$("$bin" bench --endpoints "$ETCDCTL_ENDPOINTS" --cacert "$ETCDCTL_CACERT" --cert "$ETCDCTL_CERT" \
          --key "$ETCDCTL_KEY" put --clients "$w" --total "$total" 2>&1 | grep -v BENCH_JSON | tail -1)
        deletes=0
        fields="clients=$w $(grep -o 'throughput=[0-9.]*' <<<"$out") $(grep -o 'p99_ms=[0-9.]*' <<<"$out")"
      fi
      hwm=$(for n in 1 2 3; do awk '/VmHWM/{print $2}' "/proc/$(cat "$d/n$n.pid")/status"; done | sort -n | tail -1)
      cpu=$(cpu_per_write "$t0" "$(cpu_ticks "$d")" "$(($(revision) - rev0 - deletes))")
      echo "round=$r variant=$name $fields hwm_kib=$hwm cpu_us_per_write=$cpu"
    done
    timeout 60 "$bin" down --dir "$d" >/dev/null 2>&1
  done
done
