//! InterPodAffinity: required pod affinity (the node's topology domain must already hold a
//! matching pod — or none anywhere does and the pod matches its own term, the first of a
//! group), required anti-affinity (no matching pod in the domain), existing pods'
//! anti-affinity against the incoming pod, and preferred terms (both ways) scored by weight.

use std::collections::{HashMap, HashSet};

use rkube_core::json::str_field as s;
use rkube_core::selector::LabelSelector;
use serde_json::Value;

use crate::framework::{CycleState, FilterPlugin, PreFilterPlugin, ScorePlugin, Status, MAX_SCORE};
use crate::snapshot::NodeInfo;

fn terms<'a>(pod: &'a Value, kind: &str, when: &str) -> Vec<&'a Value> {
    let field = if when == "required" {
        "requiredDuringSchedulingIgnoredDuringExecution"
    } else {
        "preferredDuringSchedulingIgnoredDuringExecution"
    };
    crate::snapshot::at(pod, &["spec", "affinity", kind, field])
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// Whether `pod` matches a PodAffinityTerm written by a pod of namespace `owner_ns`.
pub fn term_matches(term: &Value, owner_ns: &str, pod: &Value) -> bool {
    let ns = crate::snapshot::at(pod, &["metadata", "namespace"])
        .and_then(Value::as_str)
        .unwrap_or("");
    let listed: Vec<&str> = term
        .get("namespaces")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // An empty namespaceSelector ({}) selects every namespace.
    let all_namespaces = term
        .get("namespaceSelector")
        .and_then(Value::as_object)
        .is_some_and(|m| m.is_empty());
    let ns_ok = all_namespaces
        || if listed.is_empty() {
            ns == owner_ns
        } else {
            listed.contains(&ns)
        };
    // A null selector matches nothing.
    let selected = term.get("labelSelector").is_some_and(|sel| {
        !sel.is_null()
            && LabelSelector::from_json(sel).matches(
                crate::snapshot::at(pod, &["metadata", "labels"]).and_then(Value::as_object),
            )
    });
    ns_ok && selected
}

fn domain(node: &NodeInfo, key: &str) -> Option<String> {
    node.labels()
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn ns_of(pod: &Value) -> &str {
    crate::snapshot::at(pod, &["metadata", "namespace"])
        .and_then(Value::as_str)
        .unwrap_or("")
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

    fn pre_filter(&self, pod: &Value, nodes: &[NodeInfo], state: &mut CycleState) {
        let ns = ns_of(pod);
        let aff = terms(pod, "podAffinity", "required");
        let anti = terms(pod, "podAntiAffinity", "required");
        let pref_aff = terms(pod, "podAffinity", "preferred");
        let pref_anti = terms(pod, "podAntiAffinity", "preferred");
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
                        if let Some(v) = domain(node, s(t, "topologyKey")) {
                            st.affinity[i].insert(v);
                        }
                    }
                }
                for (i, t) in anti.iter().enumerate() {
                    if term_matches(t, ns, existing) {
                        if let Some(v) = domain(node, s(t, "topologyKey")) {
                            st.anti[i].insert(v);
                        }
                    }
                }
                let ens = ns_of(existing);
                for t in terms(existing, "podAntiAffinity", "required") {
                    let key = s(t, "topologyKey");
                    if term_matches(t, ens, pod) {
                        if let Some(v) = domain(node, key) {
                            st.closed.insert((key.to_string(), v));
                        }
                    }
                }
                // Preferred terms, the incoming pod's about existing pods and theirs about it.
                let mut add = |term: &Value, weight: i64, matched: bool| {
                    let key = s(term, "topologyKey");
                    if matched {
                        if let Some(v) = domain(node, key) {
                            *st.preferred.entry((key.to_string(), v)).or_default() += weight;
                        }
                    }
                };
                for (list, sign) in [(&pref_aff, 1), (&pref_anti, -1)] {
                    for wt in list.iter() {
                        let w = wt.get("weight").and_then(Value::as_i64).unwrap_or(0);
                        if let Some(t) = wt.get("podAffinityTerm") {
                            add(t, sign * w, term_matches(t, ns, existing));
                        }
                    }
                }
                for (kind, sign) in [("podAffinity", 1), ("podAntiAffinity", -1)] {
                    for wt in terms(existing, kind, "preferred") {
                        let w = wt.get("weight").and_then(Value::as_i64).unwrap_or(0);
                        if let Some(t) = wt.get("podAffinityTerm") {
                            add(t, sign * w, term_matches(t, ens, pod));
                        }
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

    fn filter(&self, pod: &Value, node: &NodeInfo, state: &CycleState) -> Status {
        let Some(st) = state.get::<State>() else {
            return Status::success();
        };
        // Kubernetes' order: the pod's affinity, its anti-affinity, then existing pods'.
        let ns = ns_of(pod);
        let aff = terms(pod, "podAffinity", "required");
        // The first pod of a group may go anywhere its own terms would match it.
        let none_anywhere = st.affinity.iter().all(|d| d.is_empty());
        let matches_itself = aff.iter().all(|t| term_matches(t, ns, pod));
        for (i, t) in aff.iter().enumerate() {
            let ok = match domain(node, s(t, "topologyKey")) {
                Some(v) => st.affinity[i].contains(&v) || (none_anywhere && matches_itself),
                None => false,
            };
            if !ok {
                return Status::unresolvable("node(s) didn't match pod affinity rules");
            }
        }
        for (i, t) in terms(pod, "podAntiAffinity", "required").iter().enumerate() {
            if domain(node, s(t, "topologyKey")).is_some_and(|v| st.anti[i].contains(&v)) {
                return Status::unschedulable("node(s) didn't match pod anti-affinity rules");
            }
        }
        let labels = node.labels();
        if st
            .closed
            .iter()
            .any(|(k, v)| labels.and_then(|l| l.get(k)).and_then(Value::as_str) == Some(v.as_str()))
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

    fn score(&self, _: &Value, node: &NodeInfo, _: &[&NodeInfo], state: &CycleState) -> i64 {
        let Some(st) = state.get::<State>() else {
            return 0;
        };
        let labels = node.labels();
        st.preferred
            .iter()
            .filter(|((k, v), _)| {
                labels.and_then(|l| l.get(k)).and_then(Value::as_str) == Some(v.as_str())
            })
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
    use crate::plugins::testing::{NodeBuilder, PodBuilder};
    use serde_json::json;
    use std::sync::Arc;

    fn labelled(name: &str, app: &str) -> Value {
        let mut p = PodBuilder::new(name).build();
        p["metadata"]["labels"] = json!({"app": app});
        p
    }

    fn nodes_with(placed: &[(&str, Value)]) -> Vec<NodeInfo> {
        let mut nodes: Vec<NodeInfo> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                NodeBuilder::new(n)
                    .label("kubernetes.io/hostname", n)
                    .build()
            })
            .collect();
        for (node, pod) in placed {
            let i = nodes.iter().position(|n| n.name == *node).unwrap();
            nodes[i].add_pod(Arc::new(pod.clone()));
        }
        nodes
    }

    fn feasible(pod: &Value, nodes: &[NodeInfo]) -> Vec<String> {
        let mut st = CycleState::default();
        InterPodAffinity.pre_filter(pod, nodes, &mut st);
        nodes
            .iter()
            .filter(|n| InterPodAffinity.filter(pod, n, &st).is_success())
            .map(|n| n.name.clone())
            .collect()
    }

    fn term(app: &str) -> Value {
        json!({"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"})
    }

    #[test]
    fn anti_affinity_spreads_and_affinity_gathers() {
        let nodes = nodes_with(&[
            ("a", labelled("web-1", "web")),
            ("b", labelled("db-1", "db")),
        ]);
        let mut spread = labelled("web-2", "web");
        spread["spec"]["affinity"] = json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term("web")]}});
        assert_eq!(feasible(&spread, &nodes), ["b", "c"]);
        let mut near_db = labelled("cache", "cache");
        near_db["spec"]["affinity"] = json!({"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term("db")]}});
        assert_eq!(feasible(&near_db, &nodes), ["b"]);
        // The first of a group that names itself may go anywhere.
        let mut first = labelled("q-1", "queue");
        first["spec"]["affinity"] = json!({"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term("queue")]}});
        assert_eq!(feasible(&first, &nodes), ["a", "b", "c"]);
    }

    #[test]
    fn existing_pods_keep_out_what_they_repel() {
        let mut loner = labelled("loner", "loner");
        loner["spec"]["affinity"] = json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term("web")]}});
        let nodes = nodes_with(&[("a", loner)]);
        assert_eq!(feasible(&labelled("web-1", "web"), &nodes), ["b", "c"]);
    }
}
