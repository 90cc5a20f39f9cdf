#!/usr/bin/env bash
# Benchmarks of the controllers and the scheduler on a three-server `rkube up` cluster (release
# build), with Node objects this script registers (no node agent yet):
#   1. a Deployment of 1,000 replicas on 50 nodes: seconds from `kubectl create` until every
#      pod is bound to a node;
#   2. control-plane failover: seconds from SIGKILL of the Raft leader until the controllers
#      on the new leader have fulfilled a scale-up requested right after the kill.
# Usage: cluster-tests/bench/controllers.sh   (BASE_PORT=62379 by default; loopback only)
#        RKUBE=/path/to/rkube cluster-tests/bench/controllers.sh   (a binary built before, say of
#        another revision to compare with; nothing is built then)
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE_PORT=${BASE_PORT:-62379}
WORK=$(mktemp -d)
if [ -z "${RKUBE:-}" ]; then
  cargo build --release -q -p rkube
  RKUBE=$PWD/target/release/rkube
fi
"$RKUBE" up --dir "$WORK/c" --base-port "$BASE_PORT" --agents 0 --node-monitor-grace-period 1h --detach >/dev/null
trap '"$RKUBE" down --dir "$WORK/c" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
# shellcheck disable=SC1091
source "$WORK/c/env"
export HOME="$WORK/home"
mkdir -p "$HOME"
now() { date +%s.%N; }
until kubectl get ns default >/dev/null 2>&1; do sleep 0.2; done

NODES=50
{
  for i in $(seq 1 $NODES); do
    printf -- '---\napiVersion: v1\nkind: Node\nmetadata: {name: node-%s, labels: {kubernetes.io/hostname: node-%s}}\n' "$i" "$i"
  done
} | kubectl apply -f - >/dev/null
for i in $(seq 1 $NODES); do
  kubectl patch node "node-$i" --subresource=status --type=merge -p \
    "{\"status\":{\"allocatable\":{\"cpu\":\"32\",\"memory\":\"64Gi\",\"pods\":\"110\"},\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"lastHeartbeatTime\":\"$(date -u +%FT%TZ)\"}]}}" >/dev/null
done

bound() {
  kubectl get pods -l "app=$1" -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c . || true
}

start=$(now)
kubectl create deployment big --image=nginx --replicas=1000 >/dev/null
until [ "$(bound big)" -ge 1000 ]; do sleep 0.5; done
end=$(now)
printf 'deployment of 1000 replicas on %s nodes: all pods bound after %.1f s\n' "$NODES" "$(echo "$end - $start" | bc)"
kubectl delete deployment big >/dev/null

kubectl create deployment fo --image=nginx --replicas=1 >/dev/null
until [ "$(bound fo)" -ge 1 ]; do sleep 0.2; done
leader=$("$RKUBE" status --dir "$WORK/c" -o json | python3 -c 'import json,sys; print([m["name"] for m in json.load(sys.stdin) if m["role"]=="leader"][0])')
other=$(for n in n1 n2 n3; do [ "$n" != "$leader" ] && echo "$n" && break; done)
start=$(now)
kill -9 "$(cat "$WORK/c/$leader.pid")"
until kubectl --context "rkube-$other" scale deployment fo --replicas=2 >/dev/null 2>&1; do sleep 0.05; done
until [ "$(kubectl --context "rkube-$other" get pods -l app=fo -o name 2>/dev/null | grep -c .)" -ge 2 ]; do sleep 0.05; done
end=$(now)
printf 'failover: scale-up fulfilled by the new leader %.2f s after SIGKILL of the leader (%s)\n' "$(echo "$end - $start" | bc)" "$leader"
