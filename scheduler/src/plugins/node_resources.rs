//! NodeResourcesFit (the pod's requests fit what the node has left; scored LeastAllocated) and
//! NodeResourcesBalancedAllocation (prefer nodes whose CPU and memory use stay even).

use k8s_openapi::api::core::v1::Pod;

use crate::framework::PreFilterPlugin;
use crate::framework::{CycleState, FilterPlugin, ScorePlugin, Status, MAX_SCORE};
use crate::snapshot::{non_zero, pod_requests, NodeInfo, Resources};

/// The pod's requests, computed once per cycle.
struct PodRequests {
    actual: Resources,
    non_zero: Resources,
}

fn requests(pod: &Pod, state: &CycleState) -> (Resources, Resources) {
    match state.get::<PodRequests>() {
        Some(r) => (r.actual, r.non_zero),
        None => {
            let r = pod_requests(pod);
            (r, non_zero(r))
        }
    }
}

pub struct Fit;

impl PreFilterPlugin for Fit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn pre_filter(&self, pod: &Pod, _: &[NodeInfo], state: &mut CycleState) {
        let actual = pod_requests(pod);
        state.insert(PodRequests {
            actual,
            non_zero: non_zero(actual),
        });
    }
}

impl FilterPlugin for Fit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn filter(&self, pod: &Pod, node: &NodeInfo, state: &CycleState) -> Status {
        let (want, _) = requests(pod, state);
        let (have, used) = (node.allocatable, node.requested);
        let mut reasons = Vec::new();
        if used.pods + 1 > have.pods {
            reasons.push("Too many pods".to_string());
        }
        if want.milli_cpu > 0 && used.milli_cpu + want.milli_cpu > have.milli_cpu {
            reasons.push("Insufficient cpu".to_string());
        }
        if want.memory > 0 && used.memory + want.memory > have.memory {
            reasons.push("Insufficient memory".to_string());
        }
        if reasons.is_empty() {
            Status::success()
        } else {
            Status {
                code: crate::framework::Code::Unschedulable,
                reasons,
            }
        }
    }
}

fn free_share(allocatable: i64, requested: i64) -> i64 {
    if allocatable <= 0 || requested > allocatable {
        0
    } else {
        (allocatable - requested).saturating_mul(MAX_SCORE) / allocatable
    }
}

impl ScorePlugin for Fit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    /// LeastAllocated: the mean share of CPU and memory left after placing the pod.
    fn score(&self, pod: &Pod, node: &NodeInfo, _: &[&NodeInfo], state: &CycleState) -> i64 {
        let (_, p) = requests(pod, state);
        let n = node.non_zero_requested;
        let cpu = free_share(node.allocatable.milli_cpu, n.milli_cpu + p.milli_cpu);
        let mem = free_share(node.allocatable.memory, n.memory + p.memory);
        (cpu + mem) / 2
    }
}

pub struct BalancedAllocation;

impl ScorePlugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        "NodeResourcesBalancedAllocation"
    }

    fn score(&self, pod: &Pod, node: &NodeInfo, _: &[&NodeInfo], state: &CycleState) -> i64 {
        let (_, p) = requests(pod, state);
        let n = node.non_zero_requested;
        let frac = |req: i64, alloc: i64| {
            if alloc <= 0 {
                1.0
            } else {
                (req as f64 / alloc as f64).min(1.0)
            }
        };
        let cpu = frac(n.milli_cpu + p.milli_cpu, node.allocatable.milli_cpu);
        let mem = frac(n.memory + p.memory, node.allocatable.memory);
        // With two resources the standard deviation is half their difference.
        let std = (cpu - mem).abs() / 2.0;
        ((1.0 - std) * MAX_SCORE as f64) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};
    use std::sync::Arc;

    #[test]
    fn requests_must_fit_what_is_left() {
        let mut node = NodeBuilder::new("n").cpu("1").build();
        node.add_pod(Arc::new(PodBuilder::new("a").cpu("600m").build()));
        let cases = [("300m", true), ("400m", true), ("500m", false)];
        for (cpu, fits) in cases {
            let s = Fit.filter(
                &PodBuilder::new("p").cpu(cpu).build(),
                &node,
                &CycleState::default(),
            );
            assert_eq!(s.is_success(), fits, "{cpu}");
            if !fits {
                assert_eq!(s.reasons, vec!["Insufficient cpu".to_string()]);
            }
        }
        // A pod without requests always fits the resources.
        assert!(Fit
            .filter(&PodBuilder::new("p").build(), &node, &CycleState::default())
            .is_success());
    }

    #[test]
    fn emptier_nodes_score_higher() {
        let empty = NodeBuilder::new("a").build();
        let mut busy = NodeBuilder::new("b").build();
        busy.add_pod(Arc::new(PodBuilder::new("x").cpu("2").build()));
        let pod = PodBuilder::new("p").build();
        assert!(
            Fit.score(&pod, &empty, &[], &CycleState::default())
                > Fit.score(&pod, &busy, &[], &CycleState::default())
        );
    }
}
