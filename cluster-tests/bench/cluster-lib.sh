# Helpers shared by the benchmarks that start three-member clusters of rkube or etcd on fresh
# data dirs with the same certificates (snapshot-install.sh, delete-range.sh, cpu-per-op.sh).
# Sourced; the caller sets WORK and RKUBE, and RKUBE_UP_ARGS / ETCD_ARGS (arrays of extra
# flags), before calling `pki` and `start`. A variant named etcd or etcd-SOMETHING is etcd.

# The threads `rkube up` gives each of its three members (up/members.rs, worker_share), given
# to each etcd member as GOMAXPROCS, as vs-etcd.sh does.
ETCD_GOMAXPROCS=${ETCD_GOMAXPROCS:-$(n=$(($(nproc) / 3)); echo $((n > 0 ? n : 1)))}

is_etcd() { case $1 in etcd | etcd-*) return 0 ;; esac; return 1; }

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
  lead=$(status_field "$1" leader | sed -n 1p)
  for m in $(status_field "$1" member); do
    i=$((i + 1)); [ "$m" = "$lead" ] && echo "$i"
  done
}

hwm() { awk '/VmHWM/{print $2}' "/proc/$1/status"; }

# max_hwm: the largest peak RSS (kB) among the members of the cluster `start` started last.
max_hwm() { for m in 1 2 3; do hwm "$(pid "$m")"; done | sort -n | tail -1; }

# pid M: the pid of member M (1-3) of the cluster `start` started last.
pid() { cat "${PIDF//%/$1}"; }

# pki: the certificates every cluster uses (PKI, TLS), made by an rkube cluster started once.
pki() {
  PKI=$WORK/pki
  if [ ! -d "$PKI" ]; then
    timeout 120 "$RKUBE" up --dir "$WORK/pki-cluster" --base-port "$PORT" --store-only --detach >/dev/null 2>&1 ||
      { echo "$(basename "$0"): rkube up failed in $WORK/pki-cluster" >&2; exit 1; }
    timeout 60 "$RKUBE" down --dir "$WORK/pki-cluster" >/dev/null 2>&1
    cp -r "$WORK/pki-cluster/pki" "$PKI"
    rm -rf "$WORK/pki-cluster"
  fi
  TLS=(--cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")
}

# start NAME BIN DIR BASE: a fresh cluster; sets PIDF (pid file pattern, % for the member)
# and START (the command that starts member % again).
start() {
  local name=$1 bin=$2 d=$3 base=$4 i c cluster=""
  if ! is_etcd "$name"; then
    cp -r "$PKI" "$d/pki"
    timeout 120 "$bin" up --dir "$d" --base-port "$base" --store-only --detach \
      "${RKUBE_UP_ARGS[@]}" >"$d/up.log" 2>&1 || return 1
    PIDF="$d/n%.pid" START="'$bin' up --dir '$d' --detach"
    return 0
  fi
  for i in 1 2 3; do cluster="$cluster${cluster:+,}e$i=https://127.0.0.1:$((base + 10 * (i - 1) + 1))"; done
  for i in 1 2 3; do
    c=$((base + 10 * (i - 1)))
    cat >"$d/e$i.start" <<EOF
GOMAXPROCS=$ETCD_GOMAXPROCS "$bin" --name e$i --data-dir "$d/e$i" ${ETCD_ARGS[*]} \\
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
  if ! is_etcd "$1"; then timeout 60 "$2" down --dir "$3" >/dev/null 2>&1; return; fi
  kill "$(cat "$3"/e1.pid)" "$(cat "$3"/e2.pid)" "$(cat "$3"/e3.pid)" 2>/dev/null
  sleep 2
  kill -9 "$(cat "$3"/e1.pid)" "$(cat "$3"/e2.pid)" "$(cat "$3"/e3.pid)" 2>/dev/null
}

# start_variant R V: the cluster of variant V (NAME=BINARY) for round R on fresh data dirs under
# WORK; sets name, bin, d (its dir), base (its first port) and E (its endpoints). Prints an
# error line and returns 1 when it does not start. Each call takes the next of ten port ranges,
# so a cluster never reuses the ports of the one stopped just before it (a member of etcd
# killed a moment earlier can still hold its peer port: rkube then could not listen on it).
STARTS=0
start_variant() {
  name=${2%%=*} bin=${2#*=} d=$WORK/r$1-$name
  rm -rf "$d"; mkdir -p "$d"
  STARTS=$((STARTS + 1))
  base=$((PORT + 30 * (STARTS % 10)))
  E=$(eps "$base")
  if ! start "$name" "$bin" "$d" "$base"; then
    echo "round=$1 variant=$name error=start-failed"; stop "$name" "$bin" "$d"; return 1
  fi
}

# round_order R: VARIANTS in the order of round R (every other round reversed), into `order`.
round_order() {
  local i
  order=("${VARIANTS[@]}")
  if [ $(($1 % 2)) = 0 ]; then
    order=(); for ((i = ${#VARIANTS[@]} - 1; i >= 0; i--)); do order+=("${VARIANTS[$i]}"); done
  fi
}
