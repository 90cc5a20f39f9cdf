//! InterPodAffinity: required pod affinity (the node's topology domain must already hold a
//! matching pod — or none anywhere does and the pod matches its own term, the first of a
//! group), required anti-affinity (no matching pod in the domain), existing pods'
//! anti-affinity against the incoming pod, and preferred terms (both ways) scored by weight.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{Affinity, Pod, PodAffinityTerm, WeightedPodAffinityTerm};
use rkube_core::selector::LabelSelector;

use crate::framework::{CycleState, FilterPlugin, PreFilterPlugin, ScorePlugin, Status, MAX_SCORE};
use crate::snapshot::{namespace, NodeInfo};

fn affinity(pod: &Pod) -> Option<&Affinity> {
    pod.spec.as_ref()?.affinity.as_ref()
}

/// The pod's required pod affinity terms.
fn required_affinity(pod: &Pod) -> &[PodAffinityTerm] {
    affinity(pod)
        .and_then(|a| a.pod_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_deref()
        })
        .unwrap_or(&[])
}

/// The pod's required pod anti-affinity terms.
fn required_anti_affinity(pod: &Pod) -> &[PodAffinityTerm] {
    affinity(pod)
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_deref()
        })
        .unwrap_or(&[])
}

/// The pod's preferred pod affinity terms.
fn preferred_affinity(pod: &Pod) -> &[WeightedPodAffinityTerm] {
    affinity(pod)
        .and_then(|a| a.pod_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_deref()
        })
        .unwrap_or(&[])
}

/// The pod's preferred pod anti-affinity terms.
fn preferred_anti_affinity(pod: &Pod) -> &[WeightedPodAffinityTerm] {
    affinity(pod)
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_deref()
        })
        .unwrap_or(&[])
}

/// Whether `pod` matches a PodAffinityTerm written by a pod of namespace `owner_ns`.
pub fn term_matches(term: &PodAffinityTerm, owner_ns: &str, pod: &Pod) -> bool {
    let ns = namespace(pod);
    let listed = term.namespaces.as_deref().unwrap_or(&[]);
    // An empty namespaceSelector ({}) selects every namespace.
    let all_namespaces = term
        .namespace_selector
        .as_ref()
        .is_some_and(|s| s.match_labels.is_none() && s.match_expressions.is_none());
    let ns_ok = all_namespaces
        || if listed.is_empty() {
            ns == owner_ns
        } else {
            listed.iter().any(|l| l == ns)
        };
    // A null selector matches nothing.
    ns_ok
        && term.label_selector.as_ref().is_some_and(|sel| {
            LabelSelector::from_selector(sel).matches_labels(pod.metadata.labels.as_ref())
        })
}

fn domain(node: &NodeInfo, key: &str) -> Option<String> {
    node.label(key).map(str::to_string)
}

/// What PreFilter learns from every placed pod, for the incoming one.
#[derive(Default)]
struct State {
    /// Per required affinity term: the domains holding a matching pod.
    affinity: Vec<HashSet<String>>,
    /// Per required anti-affinity term: the domains holding a matching pod.
    anti: Vec<HashSet<String>>,
    /// (topology key, value) domains an existing pod's anti-affinity closes to this pod.
    closed: HashSet<(String, String)>,
    /// (topology key, value) -> preference score.
    preferred: HashMap<(String, String), i64>,
}

pub struct InterPodAffinity;

impl PreFilterPlugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        "InterPodAffinity"
    }

    fn pre_filter(&self, pod: &Pod, nodes: &[NodeInfo], state: &mut CycleState) {
        let ns = namespace(pod);
        let aff = required_affinity(pod);
        let anti = required_anti_affinity(pod);
        let pref_aff = preferred_affinity(pod);
        let pref_anti = preferred_anti_affinity(pod);
        let mut st = State {
            affinity: vec![HashSet::new(); aff.len()],
            anti: vec![HashSet::new(); anti.len()],
            ..State::default()
        };
        // A pod without terms of its own only needs the pods that have terms.
        let own_terms =
            !(aff.is_empty() && anti.is_empty() && pref_aff.is_empty() && pref_anti.is_empty());
        for node in nodes {
            let existing_pods = if own_terms {
                &node.pods
            } else {
                &node.affinity_pods
            };
            for existing in existing_pods {
                for (i, t) in aff.iter().enumerate() {
                    if term_matches(t, ns, existing) {
                        if let Some(v) = domain(node, &t.topology_key) {
                            st.affinity[i].insert(v);
                        }
                    }
                }
                for (i, t) in anti.iter().enumerate() {
                    if term_matches(t, ns, existing) {
                        if let Some(v) = domain(node, &t.topology_key) {
                            st.anti[i].insert(v);
                        }
                    }
                }
                let ens = namespace(existing);
                for t in required_anti_affinity(existing) {
                    if term_matches(t, ens, pod) {
                        if let Some(v) = domain(node, &t.topology_key) {
                            st.closed.insert((t.topology_key.clone(), v));
                        }
                    }
                }
                // Preferred terms, the incoming pod's about existing pods and theirs about it.
                let mut add = |term: &PodAffinityTerm, weight: i64, matched: bool| {
                    if matched {
                        if let Some(v) = domain(node, &term.topology_key) {
                            *st.preferred
                                .entry((term.topology_key.clone(), v))
                                .or_default() += weight;
                        }
                    }
                };
                for (list, sign) in [(pref_aff, 1), (pref_anti, -1)] {
                    for wt in list {
                        let t = &wt.pod_affinity_term;
                        add(
                            t,
                            sign * i64::from(wt.weight),
                            term_matches(t, ns, existing),
                        );
                    }
                }
                let theirs = [
                    (preferred_affinity(existing), 1),
                    (preferred_anti_affinity(existing), -1),
                ];
                for (list, sign) in theirs {
                    for wt in list {
                        let t = &wt.pod_affinity_term;
                        add(t, sign * i64::from(wt.weight), term_matches(t, ens, pod));
                    }
                }
            }
        }
        state.insert(st);
    }
}

impl FilterPlugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        "InterPodAffinity"
    }

    fn filter(&self, pod: &Pod, node: &NodeInfo, state: &CycleState) -> Status {
        let Some(st) = state.get::<State>() else {
            return Status::success();
        };
        // Kubernetes' order: the pod's affinity, its anti-affinity, then existing pods'.
        let ns = namespace(pod);
        let aff = required_affinity(pod);
        // The first pod of a group may go anywhere its own terms would match it.
        let none_anywhere = st.affinity.iter().all(|d| d.is_empty());
        let matches_itself = aff.iter().all(|t| term_matches(t, ns, pod));
        for (i, t) in aff.iter().enumerate() {
            let ok = match node.label(&t.topology_key) {
                Some(v) => st.affinity[i].contains(v) || (none_anywhere && matches_itself),
                None => false,
            };
            if !ok {
                return Status::unresolvable("node(s) didn't match pod affinity rules");
            }
        }
        for (i, t) in required_anti_affinity(pod).iter().enumerate() {
            if node
                .label(&t.topology_key)
                .is_some_and(|v| st.anti[i].contains(v))
            {
                return Status::unschedulable("node(s) didn't match pod anti-affinity rules");
            }
        }
        if st
            .closed
            .iter()
            .any(|(k, v)| node.label(k) == Some(v.as_str()))
        {
            return Status::unschedulable(
                "node(s) didn't satisfy existing pods anti-affinity rules",
            );
        }
        Status::success()
    }
}

impl ScorePlugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        "InterPodAffinity"
    }

    fn score(&self, _: &Pod, node: &NodeInfo, _: &[&NodeInfo], state: &CycleState) -> i64 {
        let Some(st) = state.get::<State>() else {
            return 0;
        };
        st.preferred
            .iter()
            .filter(|((k, v), _)| node.label(k) == Some(v.as_str()))
            .map(|(_, w)| *w)
            .sum()
    }

    /// Scores may be negative (anti-affinity): scaled between the lowest and the highest.
    fn normalize(&self, scores: &mut [i64]) {
        let (min, max) = (
            scores.iter().copied().min().unwrap_or(0),
            scores.iter().copied().max().unwrap_or(0),
        );
        for s in scores.iter_mut() {
            *s = if max == min {
                0
            } else {
                (*s - min) * MAX_SCORE / (max - min)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::CycleState;
    use crate::plugins::testing::{same_host_as, NodeBuilder, PodBuilder};
    use std::sync::Arc;

    fn labelled(name: &str, app: &str) -> PodBuilder {
        PodBuilder::new(name).label("app", app)
    }

    fn nodes_with(placed: Vec<(&str, Pod)>) -> Vec<NodeInfo> {
        let mut nodes: Vec<NodeInfo> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                NodeBuilder::new(n)
                    .label("kubernetes.io/hostname", n)
                    .build()
            })
            .collect();
        for (node, pod) in placed {
            let i = nodes.iter().position(|n| n.name == node).unwrap();
            nodes[i].add_pod(Arc::new(pod));
        }
        nodes
    }

    fn feasible(pod: &Pod, nodes: &[NodeInfo]) -> Vec<String> {
        let mut st = CycleState::default();
        InterPodAffinity.pre_filter(pod, nodes, &mut st);
        nodes
            .iter()
            .filter(|n| InterPodAffinity.filter(pod, n, &st).is_success())
            .map(|n| n.name.clone())
            .collect()
    }

    #[test]
    fn anti_affinity_spreads_and_affinity_gathers() {
        let nodes = nodes_with(vec![
            ("a", labelled("web-1", "web").build()),
            ("b", labelled("db-1", "db").build()),
        ]);
        let spread = labelled("web-2", "web")
            .requires_anti_affinity(same_host_as("web"))
            .build();
        assert_eq!(feasible(&spread, &nodes), ["b", "c"]);
        let near_db = labelled("cache", "cache")
            .requires_affinity(same_host_as("db"))
            .build();
        assert_eq!(feasible(&near_db, &nodes), ["b"]);
        // The first of a group that names itself may go anywhere.
        let first = labelled("q-1", "queue")
            .requires_affinity(same_host_as("queue"))
            .build();
        assert_eq!(feasible(&first, &nodes), ["a", "b", "c"]);
    }

    #[test]
    fn existing_pods_keep_out_what_they_repel() {
        let loner = labelled("loner", "loner")
            .requires_anti_affinity(same_host_as("web"))
            .build();
        let nodes = nodes_with(vec![("a", loner)]);
        assert_eq!(
            feasible(&labelled("web-1", "web").build(), &nodes),
            ["b", "c"]
        );
    }
}
