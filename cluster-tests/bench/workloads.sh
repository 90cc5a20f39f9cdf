#!/usr/bin/env bash
# Workload controllers at scale on a three-server `rkube up` cluster (release build) with one
# agent process simulating NODES nodes, ROUNDS times:
#   1. a DaemonSet until every node's pod is Ready (status.numberReady = NODES), then a new
#      image until the rollout is done (updatedNumberScheduled and numberAvailable = NODES;
#      maxUnavailable 10%, as `kubectl rollout status` waits for);
#   2. JOBS Jobs of one completion each, created by `kubectl apply` of one list, until every
#      one is Complete (the simulated runtime ends a Job's pod at once, with exit code 0).
# Prints one line per round and measurement, and a TSV line per round to RESULTS (if set).
# Usage: cluster-tests/bench/workloads.sh   (NODES=500 JOBS=1000 ROUNDS=5 BASE_PORT=63479;
# RKUBE=<binary> to use a built binary; loopback only)
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE_PORT=${BASE_PORT:-63479}
NODES=${NODES:-500}
JOBS=${JOBS:-1000}
ROUNDS=${ROUNDS:-5}
WORK=$(mktemp -d)
if [ -z "${RKUBE:-}" ]; then
  cargo build --release -q -p rkube
  RKUBE=$PWD/target/release/rkube
fi
AGENT=""
cleanup() {
  [ -n "$AGENT" ] && kill "$AGENT" 2>/dev/null || true
  "$RKUBE" down --dir "$WORK/c" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }

"$RKUBE" up --dir "$WORK/c" --base-port "$BASE_PORT" --agents 0 --detach >/dev/null
# shellcheck disable=SC1091
source "$WORK/c/env"
export HOME="$WORK/home"
mkdir -p "$HOME"
until kubectl get ns default >/dev/null 2>&1; do sleep 0.2; done
until JOIN=$("$RKUBE" token create --print-join-command --dir "$WORK/c" 2>/dev/null); do sleep 0.3; done
TOKEN=$(echo "$JOIN" | grep -o -- '--token [^ ]*' | cut -d' ' -f2)
HASH=$(echo "$JOIN" | grep -o 'sha256:[0-9a-f]*')
SERVERS=$(grep -o 'server: https://[0-9.:]*' "$WORK/c/admin.kubeconfig" | sed 's/server: //' | paste -sd, -)
"$RKUBE" agent --token "$TOKEN" --discovery-token-ca-cert-hash "$HASH" --server "$SERVERS" --sim \
  --name sim --nodes "$NODES" --pod-cidr 10.0.0.0/8 --dir "$WORK/sim" >"$WORK/sim.log" 2>&1 &
AGENT=$!
ready_nodes() { kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready ' || true; }
until [ "$(ready_nodes)" -ge "$NODES" ]; do sleep 1; done
echo "$NODES simulated nodes Ready"

ds_field() { kubectl get ds spread -o "jsonpath={.status.$1}" 2>/dev/null || true; }
wait_ds() { # wait_ds FIELD... : until each status field equals NODES
  local f
  while :; do
    for f in "$@"; do
      [ "$(ds_field "$f")" = "$NODES" ] || { sleep 0.5; continue 2; }
    done
    return
  done
}
jobs_list() {
  python3 - "$JOBS" "$1" <<'EOF'
import json, sys
n, round_ = int(sys.argv[1]), sys.argv[2]
items = [{"apiVersion": "batch/v1", "kind": "Job",
          "metadata": {"name": f"once-{round_}-{i}", "labels": {"bench": round_}},
          "spec": {"template": {"spec": {"restartPolicy": "Never",
                   "containers": [{"name": "c", "image": "busybox:1.36"}]}}}}
         for i in range(n)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
EOF
}
complete_jobs() {
  kubectl get jobs -l "bench=$1" -o 'jsonpath={range .items[*]}{.status.succeeded}{"\n"}{end}' 2>/dev/null |
    grep -c '^1$' || true
}

for round in $(seq 1 "$ROUNDS"); do
  start=$(now)
  kubectl apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: spread
spec:
  selector:
    matchLabels: {app: spread}
  updateStrategy:
    rollingUpdate: {maxUnavailable: 10%}
  template:
    metadata:
      labels: {app: spread}
    spec:
      containers:
      - name: c
        image: busybox:1.36
EOF
  wait_ds desiredNumberScheduled numberReady
  create=$(since "$start")
  start=$(now)
  kubectl set image ds/spread c=busybox:1.37 >/dev/null
  until [ "$(kubectl get ds spread -o 'jsonpath={.status.observedGeneration}')" = 2 ]; do sleep 0.2; done
  wait_ds updatedNumberScheduled numberAvailable
  rollout=$(since "$start")
  kubectl delete ds spread --wait=false >/dev/null
  until [ "$(kubectl get pods -l app=spread --no-headers 2>/dev/null | grep -c . || true)" = 0 ]; do sleep 1; done

  jobs_list "r$round" >"$WORK/jobs.json"
  start=$(now)
  kubectl apply -f "$WORK/jobs.json" >/dev/null
  until [ "$(complete_jobs "r$round")" -ge "$JOBS" ]; do sleep 1; done
  jobs=$(since "$start")
  kubectl delete jobs -l "bench=r$round" --wait=false >/dev/null
  until [ "$(kubectl get pods --no-headers 2>/dev/null | grep -c . || true)" = 0 ]; do sleep 1; done

  printf 'round %s: DaemonSet on %s nodes Ready %.1f s, rollout %.1f s; %s Jobs Complete %.1f s\n' \
    "$round" "$NODES" "$create" "$rollout" "$JOBS" "$jobs"
  if [ -n "${RESULTS:-}" ]; then
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$NODES" "$create" "$rollout" "$JOBS" "$jobs" >>"$RESULTS"
  fi
done
