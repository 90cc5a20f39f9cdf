//! NodeUnschedulable (cordoned nodes) and NodeName (a pod that names its node).

use k8s_openapi::api::core::v1::{Pod, Taint};

use crate::framework::{CycleState, FilterPlugin, Status};
use crate::snapshot::NodeInfo;

pub struct NodeUnschedulable;

impl FilterPlugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        "NodeUnschedulable"
    }

    fn filter(&self, pod: &Pod, node: &NodeInfo, _: &CycleState) -> Status {
        let cordoned = node.node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        if !cordoned {
            return Status::success();
        }
        let taint = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let tolerated = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| rkube_core::taints::tolerates_taint(t, &taint))
            });
        if tolerated {
            Status::success()
        } else {
            Status::unresolvable("node(s) were unschedulable")
        }
    }
}

pub struct NodeName;

impl FilterPlugin for NodeName {
    fn name(&self) -> &'static str {
        "NodeName"
    }

    fn filter(&self, pod: &Pod, node: &NodeInfo, _: &CycleState) -> Status {
        match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            Some(n) if !n.is_empty() && n != node.name => {
                Status::unresolvable("node(s) didn't match the requested node name")
            }
            _ => Status::success(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};

    #[test]
    fn cordoned_nodes_take_only_pods_that_tolerate_it() {
        let node = NodeBuilder::new("n").unschedulable().build();
        let plain = PodBuilder::new("p").build();
        let tolerant = PodBuilder::new("p")
            .tolerate("node.kubernetes.io/unschedulable", "NoSchedule")
            .build();
        assert!(!NodeUnschedulable
            .filter(&plain, &node, &CycleState::default())
            .is_success());
        assert!(NodeUnschedulable
            .filter(&tolerant, &node, &CycleState::default())
            .is_success());
        assert!(NodeUnschedulable
            .filter(
                &plain,
                &NodeBuilder::new("m").build(),
                &CycleState::default()
            )
            .is_success());
    }
}
