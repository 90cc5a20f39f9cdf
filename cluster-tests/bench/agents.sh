#!/usr/bin/env bash
# Node agents with the simulated runtime on a three-server `rkube up` cluster (release build):
#   1. pod startup latency, create to Running as seen through a watch (Kubernetes' SLO: p99
#      <= 5 s), for PODS pods created by 16 clients on 20 simulated nodes (`rkube bench pods`);
#   2. agent memory per simulated node: the RSS of one `rkube agent --sim --nodes N` process
#      with N = 20 and N = NODES, all Ready;
#   3. scale: NODES simulated nodes Ready, then a Deployment of REPLICAS replicas until every
#      pod is Running.
# Usage: cluster-tests/bench/agents.sh   (PODS=1000 NODES=500 REPLICAS=5000 BASE_PORT=63379;
# loopback only)
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE_PORT=${BASE_PORT:-63379}
PODS=${PODS:-1000}
NODES=${NODES:-500}
REPLICAS=${REPLICAS:-5000}
WORK=$(mktemp -d)
cargo build --release -q -p rkube
RKUBE=$PWD/target/release/rkube
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  "$RKUBE" down --dir "$WORK/c" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
"$RKUBE" up --dir "$WORK/c" --base-port "$BASE_PORT" --agents 0 --detach >/dev/null
# shellcheck disable=SC1091
source "$WORK/c/env"
export HOME="$WORK/home"
mkdir -p "$HOME"
now() { date +%s.%N; }
until kubectl get ns default >/dev/null 2>&1; do sleep 0.2; done
until JOIN=$("$RKUBE" token create --print-join-command --dir "$WORK/c" 2>/dev/null); do sleep 0.3; done
TOKEN=$(echo "$JOIN" | grep -o -- '--token [^ ]*' | cut -d' ' -f2)
HASH=$(echo "$JOIN" | grep -o 'sha256:[0-9a-f]*')
set -- --token "$TOKEN" --discovery-token-ca-cert-hash "$HASH"
SERVERS=$(grep -o 'server: https://[0-9.:]*' "$WORK/c/admin.kubeconfig" | sed 's/server: //' | paste -sd, -)

ready_nodes() { kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready ' || true; }
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
# 1 and 2: 20 nodes, pod startup latency.
"$RKUBE" agent "$@" --server "$SERVERS" --sim --name small --nodes 20 --pod-cidr 10.200.0.0/16 \
  --dir "$WORK/small" >"$WORK/small.log" 2>&1 &
SMALL=$!
PIDS+=("$SMALL")
until [ "$(ready_nodes)" -ge 20 ]; do sleep 0.5; done
printf 'agent with 20 simulated nodes: RSS %s KiB (%s KiB per node)\n' "$(rss_kib "$SMALL")" "$(( $(rss_kib "$SMALL") / 20 ))"
"$RKUBE" bench pods --dir "$WORK/c" --pods "$PODS" --clients 16
printf 'agent with 20 simulated nodes after %s pods: RSS %s KiB\n' "$PODS" "$(rss_kib "$SMALL")"
kill "$SMALL"
for n in $(seq 0 19); do kubectl delete node "small-$n" --wait=false >/dev/null; done

# 2 and 3: NODES nodes, REPLICAS replicas.
start=$(now)
"$RKUBE" agent "$@" --server "$SERVERS" --sim --name sim --nodes "$NODES" --pod-cidr 10.0.0.0/8 \
  --dir "$WORK/sim" >"$WORK/sim.log" 2>&1 &
BIG=$!
PIDS+=("$BIG")
until [ "$(ready_nodes)" -ge "$NODES" ]; do sleep 1; done
end=$(now)
printf '%s simulated nodes Ready after %.1f s; agent RSS %s KiB (%s KiB per node)\n' "$NODES" \
  "$(echo "$end - $start" | bc)" "$(rss_kib "$BIG")" "$(( $(rss_kib "$BIG") / NODES ))"
start=$(now)
kubectl create deployment many --image=busybox --replicas="$REPLICAS" >/dev/null
running() { kubectl get pods -l app=many --field-selector=status.phase=Running --no-headers 2>/dev/null | grep -c . || true; }
until [ "$(running)" -ge "$REPLICAS" ]; do sleep 2; done
end=$(now)
printf 'deployment of %s replicas on %s simulated nodes: all Running after %.1f s; agent RSS %s KiB\n' \
  "$REPLICAS" "$NODES" "$(echo "$end - $start" | bc)" "$(rss_kib "$BIG")"
