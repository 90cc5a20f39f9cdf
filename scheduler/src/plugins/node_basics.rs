//! NodeUnschedulable (cordoned nodes) and NodeName (a pod that names its node).

use serde_json::{json, Value};

use crate::framework::{CycleState, FilterPlugin, Status};
use crate::snapshot::NodeInfo;

pub struct NodeUnschedulable;

impl FilterPlugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        "NodeUnschedulable"
    }

    fn filter(&self, pod: &Value, node: &NodeInfo, _: &CycleState) -> Status {
        let cordoned = crate::snapshot::at(&node.node, &["spec", "unschedulable"])
            .and_then(Value::as_bool)
            == Some(true);
        let taint = json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"});
        let tolerated = crate::snapshot::at(pod, &["spec", "tolerations"])
            .and_then(Value::as_array)
            .is_some_and(|ts| ts.iter().any(|t| rkube_core::taints::tolerates(t, &taint)));
        if cordoned && !tolerated {
            Status::unresolvable("node(s) were unschedulable")
        } else {
            Status::success()
        }
    }
}

pub struct NodeName;

impl FilterPlugin for NodeName {
    fn name(&self) -> &'static str {
        "NodeName"
    }

    fn filter(&self, pod: &Value, node: &NodeInfo, _: &CycleState) -> Status {
        match crate::snapshot::at(pod, &["spec", "nodeName"]).and_then(Value::as_str) {
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
            .toleration(json!({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}))
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
