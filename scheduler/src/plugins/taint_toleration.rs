//! TaintToleration: a node's NoSchedule and NoExecute taints keep out pods that do not tolerate
//! them; PreferNoSchedule taints only lower the node's score.

use serde_json::Value;

use crate::framework::{normalize_to_max, CycleState, FilterPlugin, ScorePlugin, Status};
use crate::snapshot::NodeInfo;

fn taints(node: &NodeInfo) -> &[Value] {
    crate::snapshot::at(&node.node, &["spec", "taints"])
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn tolerated(pod: &Value, taint: &Value) -> bool {
    crate::snapshot::at(pod, &["spec", "tolerations"])
        .and_then(Value::as_array)
        .is_some_and(|ts| ts.iter().any(|t| rkube_core::taints::tolerates(t, taint)))
}

pub struct TaintToleration;

impl FilterPlugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    fn filter(&self, pod: &Value, node: &NodeInfo, _: &CycleState) -> Status {
        let s = |t: &Value, f: &str| t.get(f).and_then(Value::as_str).unwrap_or("").to_string();
        for taint in taints(node) {
            let effect = s(taint, "effect");
            if (effect == "NoSchedule" || effect == "NoExecute") && !tolerated(pod, taint) {
                return Status::unresolvable(format!(
                    "node(s) had untolerated taint {{{}: {}}}",
                    s(taint, "key"),
                    s(taint, "value")
                ));
            }
        }
        Status::success()
    }
}

impl ScorePlugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    /// The number of PreferNoSchedule taints the pod does not tolerate (fewer is better).
    fn score(&self, pod: &Value, node: &NodeInfo, _: &[&NodeInfo], _: &CycleState) -> i64 {
        taints(node)
            .iter()
            .filter(|t| t.get("effect").and_then(Value::as_str) == Some("PreferNoSchedule"))
            .filter(|t| !tolerated(pod, t))
            .count() as i64
    }

    fn normalize(&self, scores: &mut [i64]) {
        normalize_to_max(scores, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};
    use serde_json::json;

    #[test]
    fn taints_keep_out_the_pods_that_do_not_tolerate_them() {
        let node = NodeBuilder::new("cp")
            .taint("node-role.kubernetes.io/control-plane", "", "NoSchedule")
            .build();
        let plain = PodBuilder::new("p").build();
        let s = TaintToleration.filter(&plain, &node, &CycleState::default());
        assert_eq!(
            s.reasons,
            vec![
                "node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"
                    .to_string()
            ]
        );
        let tolerant = PodBuilder::new("p")
            .toleration(json!({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}))
            .build();
        assert!(TaintToleration
            .filter(&tolerant, &node, &CycleState::default())
            .is_success());
        let soft = NodeBuilder::new("s")
            .taint("dedicated", "gpu", "PreferNoSchedule")
            .build();
        assert!(TaintToleration
            .filter(&plain, &soft, &CycleState::default())
            .is_success());
        assert_eq!(
            ScorePlugin::score(&TaintToleration, &plain, &soft, &[], &CycleState::default()),
            1
        );
    }
}
