//! PodTopologySpread: pods matching a constraint's selector are kept within maxSkew of each
//! other across the constraint's topology domains (DoNotSchedule filters, ScheduleAnyway
//! scores). A pod with an owner and no constraints of its own gets Kubernetes' default soft
//! spreading across nodes (maxSkew 3 by hostname) and zones (maxSkew 5).

use std::collections::{HashMap, HashSet};

use rkube_core::json::str_field as s;
use rkube_core::selector::LabelSelector;
use serde_json::{json, Value};

use crate::framework::{
    normalize_to_max, CycleState, FilterPlugin, PreFilterPlugin, ScorePlugin, Status,
};
use crate::plugins::node_affinity::NodeAffinity;
use crate::snapshot::{NodeInfo, Selector};

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
            && LabelSelector::from_json(sel).matches(
                crate::snapshot::at(pod, &["metadata", "labels"]).and_then(Value::as_object),
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
/// The number of distinct values of a label over a set of nodes, remembered for the set (by a
/// fingerprint of its nodes' label generations) until a node is added, removed or changed.
type DomainMemo = (u64, usize, HashMap<String, usize>);
static DOMAINS: std::sync::Mutex<Option<DomainMemo>> = std::sync::Mutex::new(None);

fn fingerprint(nodes: &[NodeInfo]) -> u64 {
    // splitmix64 of each generation, summed: order-free, and two different sets collide with
    // probability 2^-64.
    nodes.iter().fold(0u64, |acc, n| {
        let mut z = n.label_generation().wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        acc.wrapping_add(z ^ (z >> 31))
    })
}

fn domain_count(nodes: &[NodeInfo], key: &str) -> usize {
    let fp = fingerprint(nodes);
    let mut memo = DOMAINS.lock().unwrap_or_else(|e| e.into_inner());
    if !matches!(&*memo, Some((f, len, _)) if *f == fp && *len == nodes.len()) {
        *memo = Some((fp, nodes.len(), HashMap::new()));
    }
    let Some((_, _, by_key)) = memo.as_mut() else {
        return 0;
    };
    if let Some(n) = by_key.get(key) {
        return *n;
    }
    let distinct: HashSet<&str, Fnv> = nodes
        .iter()
        .filter_map(|n| n.labels()?.get(key)?.as_str())
        .collect();
    by_key.insert(key.to_string(), distinct.len());
    distinct.len()
}

/// One constraint, read out of the pod once per decision.
struct Constraint {
    soft: bool,
    key: String,
    max_skew: i64,
    /// Whether the pod itself matches the constraint's selector (it adds one where it goes).
    self_match: i64,
    /// Matching pods per domain that has any.
    counts: HashMap<String, i64, Fnv>,
    /// The smallest count of a domain.
    min: i64,
}

struct State {
    constraints: Vec<Constraint>,
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
                        .pod_meta
                        .iter()
                        .filter(|m| m.namespace == ns && !m.deleting && selector.matches(m))
                        .count() as i64;
                }
                for (i, key) in keys.iter().enumerate() {
                    let n = matched[which[i]];
                    // Without node affinity every node's domain counts: their number comes
                    // from the node set (remembered), so only nodes with matching pods are
                    // looked at here.
                    if n == 0 && !constrained {
                        continue;
                    }
                    let Some(v) = labels.get(*key).and_then(Value::as_str) else {
                        continue;
                    };
                    if constrained {
                        domains[i].insert(v);
                    }
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
        let key_names: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let mut out = Vec::new();
        for (i, ((c, counts), domains)) in cs.into_iter().zip(counts).zip(domains).enumerate() {
            let domains = if constrained {
                domains.len()
            } else {
                domain_count(nodes, &key_names[i])
            };
            // A domain without matching pods makes the minimum zero.
            let min = if counts.len() < domains {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            };
            out.push(Constraint {
                soft: s(&c, "whenUnsatisfiable") == "ScheduleAnyway",
                key: s(&c, "topologyKey").to_string(),
                max_skew: c.get("maxSkew").and_then(Value::as_i64).unwrap_or(1),
                self_match: i64::from(selects(&c, pod)),
                counts,
                min,
            });
        }
        state.insert(State { constraints: out });
    }
}

impl FilterPlugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        "PodTopologySpread"
    }

    fn filter(&self, _: &Value, node: &NodeInfo, state: &CycleState) -> Status {
        let Some(st) = state.get::<State>() else {
            return Status::success();
        };
        for c in &st.constraints {
            if c.soft {
                continue;
            }
            let Some(v) = node
                .labels()
                .and_then(|l| l.get(&c.key))
                .and_then(Value::as_str)
            else {
                return Status::unresolvable(
                    "node(s) didn't match pod topology spread constraints (missing required label)",
                );
            };
            let here = c.counts.get(v).copied().unwrap_or(0) + c.self_match;
            if here - c.min > c.max_skew {
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
        let labels = node.labels();
        st.constraints
            .iter()
            .filter(|c| c.soft)
            .filter_map(|c| {
                let v = labels?.get(&c.key)?.as_str()?;
                Some(c.counts.get(v).copied().unwrap_or(0))
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
        assert_eq!(state.constraints[0].counts.values().sum::<i64>(), 2);
        assert_eq!(state.constraints[0].min, 0);
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

    #[test]
    fn remembered_domain_counts_follow_node_changes() {
        let node = |name: &str, zone: &str| {
            NodeInfo::new(Arc::new(json!({"metadata": {"name": name,
                "labels": {"topology.kubernetes.io/zone": zone}}})))
        };
        let key = "topology.kubernetes.io/zone";
        let mut nodes = vec![node("n1", "a"), node("n2", "b")];
        assert_eq!(domain_count(&nodes, key), 2);
        assert_eq!(domain_count(&nodes, key), 2);
        nodes[1] = nodes[1].with_node(Arc::new(json!({"metadata": {"name": "n2",
            "labels": {"topology.kubernetes.io/zone": "a"}}})));
        assert_eq!(domain_count(&nodes, key), 1, "a relabelled node is seen");
        nodes.push(node("n3", "c"));
        assert_eq!(domain_count(&nodes, key), 2, "an added node is seen");
        nodes.remove(0);
        assert_eq!(domain_count(&nodes, key), 2);
        assert_eq!(domain_count(&nodes, "missing"), 0);
    }
}
