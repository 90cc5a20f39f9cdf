//! TaintToleration: a node's NoSchedule and NoExecute taints keep out pods that do not tolerate
//! them; PreferNoSchedule taints only lower the node's score.

use k8s_openapi::api::core::v1::{Pod, Taint};
use rkube_core::taints::tolerates_taint;

use crate::framework::{normalize_to_max, CycleState, FilterPlugin, ScorePlugin, Status};
use crate::snapshot::NodeInfo;

fn taints(node: &NodeInfo) -> &[Taint] {
    node.node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}

fn tolerated(pod: &Pod, taint: &Taint) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| tolerates_taint(t, taint)))
}

pub struct TaintToleration;

impl FilterPlugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    fn filter(&self, pod: &Pod, node: &NodeInfo, _: &CycleState) -> Status {
        for taint in taints(node) {
            let effect = taint.effect.as_str();
            if (effect == "NoSchedule" || effect == "NoExecute") && !tolerated(pod, taint) {
                return Status::unresolvable(format!(
                    "node(s) had untolerated taint {{{}: {}}}",
                    taint.key,
                    taint.value.as_deref().unwrap_or("")
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
    fn score(&self, pod: &Pod, node: &NodeInfo, _: &[&NodeInfo], _: &CycleState) -> i64 {
        taints(node)
            .iter()
            .filter(|t| t.effect == "PreferNoSchedule")
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
            .tolerate("node-role.kubernetes.io/control-plane", "NoSchedule")
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
