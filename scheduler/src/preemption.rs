//! Preemption (kube-scheduler's DefaultPreemption): when a pod fits nowhere, find the node
//! where evicting the fewest, least important pods of lower priority makes it fit. All lower
//! pods are removed in thought, the pod must then fit, and the victims are given back one by
//! one, most important first, while it still fits; the node whose victims matter least wins.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::framework::{pre_filter, run_filters, FitError, Profile};
use crate::snapshot::NodeInfo;

pub fn priority(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.priority)
        .map_or(0, i64::from)
}

/// A node and the pods to evict there.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub node: String,
    pub victims: Vec<Arc<Pod>>,
}

fn fits(profile: &Profile, pod: &Pod, nodes: &[NodeInfo], at: usize) -> bool {
    let state = pre_filter(profile, pod, nodes);
    run_filters(profile, pod, &nodes[at], &state).is_success()
}

fn rebuilt(node: &NodeInfo, keep: &[Arc<Pod>]) -> NodeInfo {
    let mut n = NodeInfo::new(node.node.clone());
    for p in keep {
        n.add_pod(p.clone());
    }
    n
}

/// Where to preempt for `pod`, if anywhere helps.
pub fn find(profile: &Profile, pod: &Pod, nodes: &[NodeInfo], fit: &FitError) -> Option<Candidate> {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never")
    {
        return None;
    }
    let mine = priority(pod);
    let mut best: Option<(Candidate, (i64, i64, usize))> = None;
    for (i, node) in nodes.iter().enumerate() {
        if fit.unresolvable.contains(&node.name) {
            continue;
        }
        let (mut lower, higher): (Vec<Arc<Pod>>, Vec<Arc<Pod>>) =
            node.pods.iter().cloned().partition(|p| priority(p) < mine);
        if lower.is_empty() {
            continue;
        }
        let mut trial: Vec<NodeInfo> = nodes.to_vec();
        trial[i] = rebuilt(node, &higher);
        if !fits(profile, pod, &trial, i) {
            continue;
        }
        // Give back the most important first while the pod still fits.
        lower.sort_by_key(|p| std::cmp::Reverse(priority(p)));
        let mut kept = higher.clone();
        let mut victims = Vec::new();
        for p in lower {
            kept.push(p.clone());
            trial[i] = rebuilt(node, &kept);
            if !fits(profile, pod, &trial, i) {
                kept.pop();
                victims.push(p);
            }
        }
        let rank = (
            victims
                .iter()
                .map(|v| priority(v))
                .max()
                .unwrap_or(i64::MIN),
            victims.iter().map(|v| priority(v)).sum::<i64>(),
            victims.len(),
        );
        if best.as_ref().is_none_or(|(_, r)| rank < *r) {
            best = Some((
                Candidate {
                    node: node.name.clone(),
                    victims,
                },
                rank,
            ));
        }
    }
    best.map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::schedule;
    use crate::plugins::default_profile;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};

    fn with_priority(name: &str, cpu: &str, prio: i32) -> PodBuilder {
        PodBuilder::new(name).cpu(cpu).priority(prio)
    }

    #[test]
    fn the_least_important_pods_make_room() {
        let mut a = NodeBuilder::new("a").cpu("2").build();
        a.add_pod(Arc::new(with_priority("a-low", "1", 10).build()));
        a.add_pod(Arc::new(with_priority("a-mid", "1", 50).build()));
        let mut b = NodeBuilder::new("b").cpu("2").build();
        b.add_pod(Arc::new(with_priority("b-high", "2", 1000).build()));
        let nodes = vec![a, b];
        let profile = default_profile();
        let pod = with_priority("urgent", "1", 100).build();
        let mut rng = rand::thread_rng();
        let fit = schedule(&profile, &pod, &nodes, &mut rng).unwrap_err();
        let c = find(&profile, &pod, &nodes, &fit).expect("a candidate");
        assert_eq!(c.node, "a");
        let names: Vec<&str> = c
            .victims
            .iter()
            .map(|v| crate::snapshot::name(&v.metadata))
            .collect();
        assert_eq!(names, ["a-low"]);
        let never = with_priority("urgent", "1", 100)
            .preemption_policy("Never")
            .build();
        assert!(find(&profile, &never, &nodes, &fit).is_none());
        let lowly = with_priority("lowly", "1", 5).build();
        assert!(find(&profile, &lowly, &nodes, &fit).is_none());
    }
}
