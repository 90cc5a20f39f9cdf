//! PodTopologySpread: pods matching a constraint's selector are kept within maxSkew of each
//! other across the constraint's topology domains (DoNotSchedule filters, ScheduleAnyway
//! scores). A pod with an owner and no constraints of its own gets Kubernetes' default soft
//! spreading across nodes (maxSkew 3 by hostname) and zones (maxSkew 5).

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use crate::framework::{
    normalize_to_max, CycleState, FilterPlugin, PreFilterPlugin, ScorePlugin, Status,
};
use crate::plugins::node_affinity::NodeAffinity;
use crate::snapshot::{NodeInfo, Selector};

fn s<'a>(v: &'a Value, f: &str) -> &'a str {
    v.get(f).and_then(Value::as_str).unwrap_or("")
}

/// The pod's constraints, or the system defaults for an owned pod.
fn constraints(pod: &Value) -> Vec<Value> {
    if let Some(cs) =
        crate::snapshot::at(pod, &["spec", "topologySpreadConstraints"]).and_then(Value::as_array)
    {
        if !cs.is_empty() {
            return cs.clone();
        }
    }
    let owned = crate::snapshot::at(pod, &["metadata", "ownerReferences"])
        .and_then(Value::as_array)
        .is_some_and(|r| !r.is_empty());
    let labels = crate::snapshot::at(pod, &["metadata", "labels"])
        .cloned()
        .unwrap_or(json!({}));
    if !owned || labels.as_object().is_none_or(|l| l.is_empty()) {
        return Vec::new();
    }
    let selector = json!({"matchLabels": labels});
    vec![
        json!({"maxSkew": 3, "topologyKey": "kubernetes.io/hostname",
               "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": selector}),
        json!({"maxSkew": 5, "topologyKey": "topology.kubernetes.io/zone",
               "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": selector}),
    ]
}

fn selects(c: &Value, pod: &Value) -> bool {
    c.get("labelSelector").is_some_and(|sel| {
        !sel.is_null()
            && rkube_api::admission::selector_matches_labels(
                sel,
                crate::snapshot::at(pod, &["metadata", "labels"]),
            )
    })
}

/// Clusters at least this large are counted on two threads.
const PARALLEL_FROM: usize = 1000;

/// FNV-1a: the domain sets are rebuilt for every decision, and their short keys need no
/// protection from collisions chosen by an attacker (they are node labels).
#[derive(Default, Clone, Copy)]
struct Fnv;

struct FnvHasher(u64);

impl std::hash::BuildHasher for Fnv {
    type Hasher = FnvHasher;
    fn build_hasher(&self) -> FnvHasher {
        FnvHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for FnvHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Per constraint: matching pods per domain value, over the nodes the pod could go to.
struct State {
    /// (constraint, matching pods per domain that has any, the smallest count of a domain).
    constraints: Vec<(Value, HashMap<String, i64, Fnv>, i64)>,
}

pub struct PodTopologySpread;

impl PreFilterPlugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        "PodTopologySpread"
    }

    fn pre_filter<'a>(&self, pod: &Value, nodes: &'a [NodeInfo], state: &mut CycleState) {
        let ns = crate::snapshot::at(pod, &["metadata", "namespace"])
            .and_then(Value::as_str)
            .unwrap_or("");
        let empty = CycleState::default();
        let constrained = crate::snapshot::at(pod, &["spec", "nodeSelector"]).is_some()
            || crate::snapshot::at(pod, &["spec", "affinity", "nodeAffinity"]).is_some();
        let cs = constraints(pod);
        // Constraints that share a selector (the defaults do) share one count per node.
        let mut selectors: Vec<(Value, Selector)> = Vec::new();
        let which: Vec<usize> = cs
            .iter()
            .map(|c| {
                let sel = c.get("labelSelector").cloned().unwrap_or(Value::Null);
                match selectors.iter().position(|(v, _)| *v == sel) {
                    Some(i) => i,
                    None => {
                        let compiled = Selector::new(Some(&sel));
                        selectors.push((sel, compiled));
                        selectors.len() - 1
                    }
                }
            })
            .collect();
        let keys: Vec<&str> = cs.iter().map(|c| s(c, "topologyKey")).collect();
        // Counts over a run of nodes: (per constraint: matching pods per domain, the domains).
        type Counts<'a> = (Vec<HashMap<String, i64, Fnv>>, Vec<HashSet<&'a str, Fnv>>);
        let count = |chunk: &'a [NodeInfo]| -> Counts<'a> {
            let mut counts: Vec<HashMap<String, i64, Fnv>> = vec![HashMap::default(); keys.len()];
            let mut domains: Vec<HashSet<&str, Fnv>> = vec![HashSet::default(); keys.len()];
            let mut matched = vec![0i64; selectors.len()];
            for node in chunk {
                // Domains of nodes the pod's node affinity rules out do not count (Honor).
                if constrained && !NodeAffinity.filter(pod, node, &empty).is_success() {
                    continue;
                }
                let Some(labels) = node.labels() else {
                    continue;
                };
                for (k, (_, selector)) in selectors.iter().enumerate() {
                    matched[k] = node
                        .pods
                        .iter()
                        .zip(&node.pod_meta)
                        .filter(|(p, m)| m.namespace == ns && !m.deleting && selector.matches(m, p))
                        .count() as i64;
                }
                for (i, key) in keys.iter().enumerate() {
                    let Some(v) = labels.get(*key).and_then(Value::as_str) else {
                        continue;
                    };
                    domains[i].insert(v);
                    let n = matched[which[i]];
                    if n > 0 {
                        *counts[i].entry(v.to_string()).or_default() += n;
                    }
                }
            }
            (counts, domains)
        };
        // A large cluster is counted on two threads, as kube-scheduler parallelizes its work.
        let (counts, domains) = if nodes.len() >= PARALLEL_FROM {
            let (left, right) = nodes.split_at(nodes.len() / 2);
            std::thread::scope(|scope| {
                let other = scope.spawn(|| count(right));
                let (mut counts, mut domains) = count(left);
                if let Ok((c2, d2)) = other.join() {
                    for (into, from) in counts.iter_mut().zip(c2) {
                        for (k, v) in from {
                            *into.entry(k).or_default() += v;
                        }
                    }
                    for (into, from) in domains.iter_mut().zip(d2) {
                        into.extend(from);
                    }
                }
                (counts, domains)
            })
        } else {
            count(nodes)
        };
        let mut out = Vec::new();
        for ((c, counts), domains) in cs.into_iter().zip(counts).zip(domains) {
            // A domain without matching pods makes the minimum zero.
            let min = if counts.len() < domains.len() {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            };
            out.push((c, counts, min));
        }
        state.insert(State { constraints: out });
    }
}

impl FilterPlugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        "PodTopologySpread"
    }

    fn filter(&self, pod: &Value, node: &NodeInfo, state: &CycleState) -> Status {
        let Some(st) = state.get::<State>() else {
            return Status::success();
        };
        for (c, counts, min) in &st.constraints {
            if s(c, "whenUnsatisfiable") == "ScheduleAnyway" {
                continue;
            }
            let key = s(c, "topologyKey");
            let Some(v) = node
                .labels()
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)
            else {
                return Status::unresolvable(
                    "node(s) didn't match pod topology spread constraints (missing required label)",
                );
            };
            let here = counts.get(v).copied().unwrap_or(0) + i64::from(selects(c, pod));
            let max_skew = c.get("maxSkew").and_then(Value::as_i64).unwrap_or(1);
            if here - *min > max_skew {
                return Status::unschedulable(
                    "node(s) didn't match pod topology spread constraints",
                );
            }
        }
        Status::success()
    }
}

impl ScorePlugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        "PodTopologySpread"
    }

    /// Matching pods already in the node's domains (fewer is better).
    fn score(&self, _: &Value, node: &NodeInfo, _: &[&NodeInfo], state: &CycleState) -> i64 {
        let Some(st) = state.get::<State>() else {
            return 0;
        };
        st.constraints
            .iter()
            .filter(|(c, _, _)| s(c, "whenUnsatisfiable") == "ScheduleAnyway")
            .filter_map(|(c, counts, _)| {
                let v = node.labels()?.get(s(c, "topologyKey"))?.as_str()?;
                Some(counts.get(v).copied().unwrap_or(0))
            })
            .sum()
    }

    fn normalize(&self, scores: &mut [i64]) {
        normalize_to_max(scores, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};
    use std::sync::Arc;

    fn web(name: &str) -> Value {
        let mut p = PodBuilder::new(name).build();
        p["metadata"]["labels"] = json!({"app": "web"});
        p
    }

    #[test]
    fn hard_constraints_keep_skew_within_bounds() {
        let mut nodes: Vec<NodeInfo> = ["a", "b"]
            .iter()
            .map(|n| NodeBuilder::new(n).label("zone", n).build())
            .collect();
        nodes[0].add_pod(Arc::new(web("w1")));
        let mut pod = web("w2");
        pod["spec"]["topologySpreadConstraints"] = json!([{"maxSkew": 1, "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]);
        let mut st = CycleState::default();
        PodTopologySpread.pre_filter(&pod, &nodes, &mut st);
        assert!(!PodTopologySpread.filter(&pod, &nodes[0], &st).is_success());
        assert!(PodTopologySpread.filter(&pod, &nodes[1], &st).is_success());
        let bare = NodeBuilder::new("c").build();
        assert!(!PodTopologySpread.filter(&pod, &bare, &st).is_success());
    }

    #[test]
    fn large_clusters_count_the_same_on_two_threads() {
        let mut nodes: Vec<NodeInfo> = (0..PARALLEL_FROM + 200)
            .map(|i| {
                let n = format!("n{i}");
                NodeBuilder::new(&n)
                    .label("kubernetes.io/hostname", &n)
                    .build()
            })
            .collect();
        // One matching pod on a node of each half.
        nodes[3].add_pod(Arc::new(web("w1")));
        nodes[PARALLEL_FROM + 100].add_pod(Arc::new(web("w2")));
        let mut pod = web("w3");
        pod["spec"]["topologySpreadConstraints"] = json!([{"maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}}}]);
        let mut st = CycleState::default();
        PodTopologySpread.pre_filter(&pod, &nodes, &mut st);
        assert!(!PodTopologySpread.filter(&pod, &nodes[3], &st).is_success());
        assert!(!PodTopologySpread
            .filter(&pod, &nodes[PARALLEL_FROM + 100], &st)
            .is_success());
        assert!(PodTopologySpread.filter(&pod, &nodes[7], &st).is_success());
        let state = st.get::<State>().expect("state");
        assert_eq!(state.constraints[0].1.values().sum::<i64>(), 2);
        assert_eq!(state.constraints[0].2, 0);
    }

    #[test]
    fn owned_pods_spread_softly_by_default() {
        let mut nodes: Vec<NodeInfo> = ["a", "b"]
            .iter()
            .map(|n| {
                NodeBuilder::new(n)
                    .label("kubernetes.io/hostname", n)
                    .build()
            })
            .collect();
        nodes[0].add_pod(Arc::new(web("w1")));
        let mut pod = web("w2");
        pod["metadata"]["ownerReferences"] =
            json!([{"kind": "ReplicaSet", "name": "w", "controller": true}]);
        let mut st = CycleState::default();
        PodTopologySpread.pre_filter(&pod, &nodes, &mut st);
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let mut scores: Vec<i64> = nodes
            .iter()
            .map(|n| PodTopologySpread.score(&pod, n, &refs, &st))
            .collect();
        PodTopologySpread.normalize(&mut scores);
        assert!(scores[1] > scores[0], "{scores:?}");
    }
}
