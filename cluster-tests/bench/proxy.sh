#!/usr/bin/env bash
# The node agents' service proxy on `rkube up --runtime cri` (release build, root): how long an
# agent takes to program SERVICES Services with ENDPOINTS endpoints each (one iptables-restore
# of the whole rule set), and the delay from an endpoint change in the API to the rule change in
# the node's nat table (Kubernetes' network programming latency SLI; SLO p99 <= 30 s).
# Usage: cluster-tests/bench/proxy.sh   (SERVICES=1000 ENDPOINTS=10 CHANGES=20 BASE_PORT=64379)
# Traffic stays on this machine: the Services' endpoints are addresses nothing answers at.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE_PORT=${BASE_PORT:-64379}
SERVICES=${SERVICES:-1000}
ENDPOINTS=${ENDPOINTS:-10}
CHANGES=${CHANGES:-20}
WORK=$(mktemp -d)
cargo build --release -q -p rkube
RKUBE=$PWD/target/release/rkube
cleanup() {
  "$RKUBE" down --dir "$WORK/c" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
"$RKUBE" up --dir "$WORK/c" --base-port "$BASE_PORT" --runtime cri --agents 1 --detach >/dev/null
# shellcheck disable=SC1091
source "$WORK/c/env"
export HOME="$WORK/home"
mkdir -p "$HOME"
NS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["network"]["bridge"] + "-agent1")' "$WORK/c/cluster.json")
nat() { ip netns exec "$NS" iptables-save -t nat; }
now() { date +%s.%N; }

# Services without selectors, each with a hand-made EndpointSlice of ENDPOINTS addresses.
python3 - "$SERVICES" "$ENDPOINTS" > "$WORK/objects.json" <<'EOF'
import json, sys
n, e = int(sys.argv[1]), int(sys.argv[2])
items = []
for i in range(n):
    name = f"svc-{i}"
    items.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                  "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
    items.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                  "metadata": {"name": name, "labels": {"kubernetes.io/service-name": name}},
                  "addressType": "IPv4",
                  "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                  "endpoints": [{"addresses": [f"172.31.{(i * e + j) // 250}.{(i * e + j) % 250 + 1}"],
                                 "conditions": {"ready": True}} for j in range(e)]})
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
EOF
start=$(now)
kubectl create -f "$WORK/objects.json" >/dev/null
created=$(now)
want=$((SERVICES * ENDPOINTS))
until [ "$(nat | grep -c -- '-j DNAT')" -ge "$want" ]; do sleep 0.2; done
programmed=$(now)
sync=$(grep "service rules synced" "$WORK/c/agent1.log" | tail -1)
echo "created $SERVICES Services + EndpointSlices in $(echo "$created - $start" | bc) s; all $want endpoints programmed $(echo "$programmed - $created" | bc) s after the last create"
echo "last sync: $sync"

# Endpoint changes: one address replaced at a time, timed until the nat table has it.
lat=()
for i in $(seq 1 "$CHANGES"); do
  ip="172.30.$((i / 250)).$((i % 250 + 1))"
  t0=$(now)
  kubectl patch endpointslice "svc-$((i * 7 % SERVICES))" --type=json \
    -p "[{\"op\":\"replace\",\"path\":\"/endpoints/0/addresses/0\",\"value\":\"$ip\"}]" >/dev/null
  until [ "$(nat | grep -c -- "--to-destination $ip:8080")" -gt 0 ]; do sleep 0.01; done
  t1=$(now)
  lat+=("$(echo "($t1 - $t0) * 1000" | bc)")
done
printf '%s\n' "${lat[@]}" | sort -n > "$WORK/lat"
p50=$(awk -v n="$CHANGES" 'NR==int((n+1)/2)' "$WORK/lat")
p99=$(tail -1 "$WORK/lat")
echo "endpoint change to rule change ($CHANGES changes, kubectl patch included): p50 ${p50} ms, max ${p99} ms"
echo "BENCH_JSON {\"workload\":\"proxy\",\"services\":$SERVICES,\"endpoints\":$ENDPOINTS,\"programmed_s\":$(echo "$programmed - $created" | bc),\"change_p50_ms\":$p50,\"change_max_ms\":$p99}"
