//! NodeResourcesFit (the pod's requests fit what the node has left; scored LeastAllocated) and
//! NodeResourcesBalancedAllocation (prefer nodes whose CPU and memory use stay even).

use serde_json::Value;

use crate::framework::{CycleState, FilterPlugin, ScorePlugin, Status, MAX_SCORE};
use crate::snapshot::{pod_requests, NodeInfo, Resources};

/// What scoring assumes for a container without requests (kube-scheduler's non-zero
/// defaults), so empty pods still spread.
const DEFAULT_MILLI_CPU: i64 = 100;
const DEFAULT_MEMORY: i64 = 200 * 1024 * 1024;

fn non_zero(pod: &Value) -> Resources {
    let r = pod_requests(pod);
    Resources {
        milli_cpu: if r.milli_cpu == 0 {
            DEFAULT_MILLI_CPU
        } else {
            r.milli_cpu
        },
        memory: if r.memory == 0 {
            DEFAULT_MEMORY
        } else {
            r.memory
        },
        pods: 1,
    }
}

fn node_non_zero(node: &NodeInfo) -> Resources {
    let mut total = Resources::default();
    for p in &node.pods {
        let r = non_zero(p);
        total.milli_cpu += r.milli_cpu;
        total.memory += r.memory;
    }
    total
}

pub struct Fit;

impl FilterPlugin for Fit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn filter(&self, pod: &Value, node: &NodeInfo, _: &CycleState) -> Status {
        let want = pod_requests(pod);
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
        (allocatable - requested) * MAX_SCORE / allocatable
    }
}

impl ScorePlugin for Fit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    /// LeastAllocated: the mean share of CPU and memory left after placing the pod.
    fn score(&self, pod: &Value, node: &NodeInfo, _: &[&NodeInfo], _: &CycleState) -> i64 {
        let (p, n) = (non_zero(pod), node_non_zero(node));
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

    fn score(&self, pod: &Value, node: &NodeInfo, _: &[&NodeInfo], _: &CycleState) -> i64 {
        let (p, n) = (non_zero(pod), node_non_zero(node));
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
