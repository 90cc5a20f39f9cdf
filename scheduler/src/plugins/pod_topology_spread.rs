//! PodTopologySpread: pods matching a constraint's selector are kept within maxSkew of each
//! other across the constraint's topology domains (DoNotSchedule filters, ScheduleAnyway
//! scores). A pod with an owner and no constraints of its own gets Kubernetes' default soft
//! spreading across nodes (maxSkew 3 by hostname) and zones (maxSkew 5).

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{Pod, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use rkube_core::selector::LabelSelector;

use crate::framework::{
    normalize_to_max, CycleState, FilterPlugin, PreFilterPlugin, ScorePlugin, Status,
};
use crate::plugins::node_affinity::NodeAffinity;
use crate::snapshot::{namespace, NodeInfo};

/// The pod's constraints, or the system defaults for an owned pod.
fn constraints(pod: &Pod) -> Vec<TopologySpreadConstraint> {
    if let Some(cs) = pod
        .spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.as_ref())
    {
        if !cs.is_empty() {
            return cs.clone();
        }
    }
    let owned = pod
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|r| !r.is_empty());
    let labels = match &pod.metadata.labels {
        Some(l) if owned && !l.is_empty() => l,
        _ => return Vec::new(),
    };
    let soft = |max_skew, key: &str| TopologySpreadConstraint {
        max_skew,
        topology_key: key.to_string(),
        when_unsatisfiable: "ScheduleAnyway".to_string(),
        label_selector: Some(metav1::LabelSelector {
            match_labels: Some(labels.clone()),
            match_expressions: None,
        }),
        ..Default::default()
    };
    vec![
        soft(3, "kubernetes.io/hostname"),
        soft(5, "topology.kubernetes.io/zone"),
    ]
}

/// A constraint's selector, ready to match many pods (a null selector matches nothing).
fn compile(selector: Option<&metav1::LabelSelector>) -> Option<LabelSelector> {
    selector.map(LabelSelector::from_selector)
}

fn selects(selector: Option<&LabelSelector>, pod: &Pod) -> bool {
    selector.is_some_and(|s| s.matches_labels(pod.metadata.labels.as_ref()))
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
    let distinct: HashSet<&str, Fnv> = nodes.iter().filter_map(|n| n.label(key)).collect();
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

    fn pre_filter<'a>(&self, pod: &Pod, nodes: &'a [NodeInfo], state: &mut CycleState) {
        let ns = namespace(pod);
        // NodeAffinity's PreFilter state, when it ran before (the default profile).
        let affinity_state: &CycleState = state;
        let constrained = pod.spec.as_ref().is_some_and(|s| {
            s.node_selector.is_some()
                || s.affinity
                    .as_ref()
                    .is_some_and(|a| a.node_affinity.is_some())
        });
        let cs = constraints(pod);
        // Constraints that share a selector (the defaults do) share one count per node.
        let mut selectors: Vec<(Option<&metav1::LabelSelector>, Option<LabelSelector>)> =
            Vec::new();
        let which: Vec<usize> = cs
            .iter()
            .map(|c| {
                let sel = c.label_selector.as_ref();
                match selectors.iter().position(|(v, _)| *v == sel) {
                    Some(i) => i,
                    None => {
                        selectors.push((sel, compile(sel)));
                        selectors.len() - 1
                    }
                }
            })
            .collect();
        let keys: Vec<&str> = cs.iter().map(|c| c.topology_key.as_str()).collect();
        // Counts over a run of nodes: (per constraint: matching pods per domain, the domains).
        type Counts<'a> = (Vec<HashMap<String, i64, Fnv>>, Vec<HashSet<&'a str, Fnv>>);
        let count = |chunk: &'a [NodeInfo]| -> Counts<'a> {
            let mut counts: Vec<HashMap<String, i64, Fnv>> = vec![HashMap::default(); keys.len()];
            let mut domains: Vec<HashSet<&str, Fnv>> = vec![HashSet::default(); keys.len()];
            let mut matched = vec![0i64; selectors.len()];
            for node in chunk {
                // Domains of nodes the pod's node affinity rules out do not count (Honor).
                if constrained && !NodeAffinity.filter(pod, node, affinity_state).is_success() {
                    continue;
                }
                let Some(labels) = node.labels() else {
                    continue;
                };
                for (k, (_, selector)) in selectors.iter().enumerate() {
                    matched[k] = node
                        .pods
                        .iter()
                        .filter(|p| {
                            namespace(p) == ns
                                && p.metadata.deletion_timestamp.is_none()
                                && selects(selector.as_ref(), p)
                        })
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
                    let Some(v) = labels.get(*key).map(String::as_str) else {
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
        let mut out = Vec::new();
        for (i, ((c, counts), domains)) in cs.iter().zip(counts).zip(domains).enumerate() {
            let domains = if constrained {
                domains.len()
            } else {
                domain_count(nodes, &c.topology_key)
            };
            // A domain without matching pods makes the minimum zero.
            let min = if counts.len() < domains {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            };
            out.push(Constraint {
                soft: c.when_unsatisfiable == "ScheduleAnyway",
                key: c.topology_key.clone(),
                // An absent maxSkew decodes as 0; it counts as 1 (Kubernetes requires >= 1).
                max_skew: if c.max_skew == 0 {
                    1
                } else {
                    i64::from(c.max_skew)
                },
                self_match: i64::from(selects(selectors[which[i]].1.as_ref(), pod)),
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

    fn filter(&self, _: &Pod, node: &NodeInfo, state: &CycleState) -> Status {
        let Some(st) = state.get::<State>() else {
            return Status::success();
        };
        for c in &st.constraints {
            if c.soft {
                continue;
            }
            let Some(v) = node.label(&c.key) else {
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
    fn score(&self, _: &Pod, node: &NodeInfo, _: &[&NodeInfo], state: &CycleState) -> i64 {
        let Some(st) = state.get::<State>() else {
            return 0;
        };
        st.constraints
            .iter()
            .filter(|c| c.soft)
            .filter_map(|c| {
                let v = node.label(&c.key)?;
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
    use crate::plugins::testing::{match_labels, NodeBuilder, PodBuilder};
    use std::sync::Arc;

    fn web(name: &str) -> PodBuilder {
        PodBuilder::new(name).label("app", "web")
    }

    /// At most one more `app=web` pod per `key` domain than in the emptiest.
    fn hard_skew_1(key: &str) -> TopologySpreadConstraint {
        TopologySpreadConstraint {
            max_skew: 1,
            topology_key: key.into(),
            when_unsatisfiable: "DoNotSchedule".into(),
            label_selector: Some(match_labels("app", "web")),
            ..Default::default()
        }
    }

    #[test]
    fn hard_constraints_keep_skew_within_bounds() {
        let mut nodes: Vec<NodeInfo> = ["a", "b"]
            .iter()
            .map(|n| NodeBuilder::new(n).label("zone", n).build())
            .collect();
        nodes[0].add_pod(Arc::new(web("w1").build()));
        let pod = web("w2").spread(hard_skew_1("zone")).build();
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
        nodes[3].add_pod(Arc::new(web("w1").build()));
        nodes[PARALLEL_FROM + 100].add_pod(Arc::new(web("w2").build()));
        let pod = web("w3")
            .spread(hard_skew_1("kubernetes.io/hostname"))
            .build();
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
        nodes[0].add_pod(Arc::new(web("w1").build()));
        let pod = web("w2").owner("ReplicaSet", "w").build();
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
        let key = "topology.kubernetes.io/zone";
        let node = |name: &str, zone: &str| NodeBuilder::new(name).label(key, zone);
        let mut nodes = vec![node("n1", "a").build(), node("n2", "b").build()];
        assert_eq!(domain_count(&nodes, key), 2);
        assert_eq!(domain_count(&nodes, key), 2);
        nodes[1] = nodes[1].with_node(Arc::new(node("n2", "a").node()));
        assert_eq!(domain_count(&nodes, key), 1, "a relabelled node is seen");
        nodes.push(node("n3", "c").build());
        assert_eq!(domain_count(&nodes, key), 2, "an added node is seen");
        nodes.remove(0);
        assert_eq!(domain_count(&nodes, key), 2);
        assert_eq!(domain_count(&nodes, "missing"), 0);
    }
}
