#!/usr/bin/env bash
# Put throughput and latency of a three-member rkube cluster and a three-member etcd cluster,
# side by side on this machine, with the same client (`rkube bench put`), the same TLS setup
# (mutual TLS on client and peer ports, certificates from rkube's CA) and fsync on.
#
#   cluster-tests/bench/put-vs-etcd.sh [WORKDIR]
#
# Needs a release build (cargo build --release -p rkube) and etcd 3.4 (Debian's etcd-server).
set -euo pipefail
cd "$(dirname "$0")/../.."
RKUBE=${RKUBE:-target/release/rkube}
WORK=${1:-$(mktemp -d)}
RK=$WORK/rkube
ET=$WORK/etcd
mkdir -p "$ET"
cleanup() {
  "$RKUBE" down --dir "$RK" >/dev/null 2>&1 || true
  [ -n "${ETCD_PIDS:-}" ] && kill $ETCD_PIDS 2>/dev/null || true
}
trap cleanup EXIT

"$RKUBE" up --dir "$RK" --base-port 32379 --detach >/dev/null
PKI=$RK/pki
for i in 1 2 3; do
  base=$((42369 + 10 * i))
  etcd --name "e$i" --data-dir "$ET/e$i" \
    --listen-client-urls "https://127.0.0.1:$base" --advertise-client-urls "https://127.0.0.1:$base" \
    --listen-peer-urls "https://127.0.0.1:$((base + 1))" --initial-advertise-peer-urls "https://127.0.0.1:$((base + 1))" \
    --initial-cluster "e1=https://127.0.0.1:42380,e2=https://127.0.0.1:42390,e3=https://127.0.0.1:42400" \
    --initial-cluster-token bench --initial-cluster-state new \
    --cert-file "$PKI/n$i.crt" --key-file "$PKI/n$i.key" --trusted-ca-file "$PKI/ca.crt" --client-cert-auth \
    --peer-cert-file "$PKI/n$i.crt" --peer-key-file "$PKI/n$i.key" --peer-trusted-ca-file "$PKI/ca.crt" \
    --peer-client-cert-auth >"$ET/e$i.log" 2>&1 &
  ETCD_PIDS="${ETCD_PIDS:-} $!"
done
TLS=(--cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")
ETCD_EPS=https://127.0.0.1:42379,https://127.0.0.1:42389,https://127.0.0.1:42399
for _ in $(seq 100); do
  ETCDCTL_API=3 etcdctl --endpoints=$ETCD_EPS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    endpoint health >/dev/null 2>&1 && break
  sleep 0.2
done

leader_endpoint() { # the leader's client URL of a cluster, given its endpoints
  ETCDCTL_API=3 etcdctl --endpoints="$1" --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    endpoint status -w json | python3 -c 'import json,sys; print([s["Endpoint"] for s in json.load(sys.stdin) if s["Status"]["leader"]==s["Status"]["header"]["member_id"]][0])'
}
RK_EPS=https://127.0.0.1:32379,https://127.0.0.1:32389,https://127.0.0.1:32399
RK_LEADER=$(leader_endpoint $RK_EPS)
ET_LEADER=$(leader_endpoint $ETCD_EPS)

echo "date: $(date -u +%F) machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
for clients in 1 64; do
  total=$((clients == 1 ? 2000 : 20000))
  echo "== $clients client(s), $total puts of 256 B to the leader"
  echo -n "rkube: "; "$RKUBE" bench --endpoints "$RK_LEADER" "${TLS[@]}" put --clients $clients --total $total
  echo -n "etcd:  "; "$RKUBE" bench --endpoints "$ET_LEADER" "${TLS[@]}" put --clients $clients --total $total
done
